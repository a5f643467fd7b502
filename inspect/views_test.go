package inspect_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/presence"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// A drop names its reason and the other entry: "locked" met a live holder (named, with
// its fence and entry), "superseded" entered its stream before another entry's run of
// the issue ended, and has no holder to name (it used to read "held by  (fence 0, …)").
func TestHistoryNamesWhyADropDidNotRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other := e.Locker(lease.Options{Scope: e.Namespace, TTL: time.Minute, Owner: "w9"})
	held, err := other.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	e.PublishTriage("RHEL-1")
	first := e.PublishTriage("RHEL-2")
	second := e.PublishTriage("RHEL-2") // queued while the first is in the stream: superseded
	e.StartTriage(ctx, pipelinetest.TriageOptions{}, func(*message.Message) error { return nil })
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.Records(event.LockDropped)) == 2 }, "two drops")

	in := e.inspector(nil, 0)
	drop := func(key string) inspect.HistoryEvent {
		t.Helper()
		evs, err := in.History(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.EventType == event.LockDropped {
				return ev
			}
		}
		t.Fatalf("no lock.dropped in the history of %s: %+v", key, evs)
		return inspect.HistoryEvent{}
	}
	locked := drop("RHEL-1")
	if locked.Reason != "locked" || locked.Holder != "w9" || locked.OtherEntry != "1-1" || locked.HolderFence != "1" ||
		locked.Detail != "held by w9 (fence 1) for entry 1-1" {
		t.Errorf("locked drop = %+v", locked)
	}
	sup := drop("RHEL-2")
	if sup.Reason != "superseded" || sup.OtherEntry != first || sup.Holder != "" ||
		!strings.HasPrefix(sup.Detail, "superseded by entry "+first) || strings.Contains(sup.Detail, "held by") ||
		sup.About != e.TriageStream()+" "+second {
		t.Errorf("superseded drop = %+v (first %s, second %s)", sup, first, second)
	}
}

// A worker is listed from its own presence beat as soon as its router runs, alive while
// it waits on empty streams; it is gone at once when it stops cleanly, and a beat that
// expired (a killed worker) reads as dead, not as idle.
func TestWorkersReportTheirOwnPresence(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, done := e.StartTriage(ctx, pipelinetest.TriageOptions{Consumer: "w1"}, func(*message.Message) error { return nil })
	in := e.inspector(nil, 0)

	ws, err := in.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || !ws[0].Alive || !ws[1].Alive || ws[0].Consumer != "w1-0" || ws[0].Agent != "triage" || ws[0].PID == 0 {
		t.Fatalf("workers = %+v, want w1-0 alive on both triage streams", ws)
	}
	streams, err := in.Streams(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range streams {
		if len(s.Groups) != 1 || len(s.Groups[0].Consumers) != 1 || s.Groups[0].Consumers[0].State != inspect.ConsumerAlive ||
			!strings.Contains(s.Groups[0].Consumers[0].Process, "pid ") {
			t.Errorf("stream %s = %+v, want consumer w1-0 alive", s.Stream, s.Groups)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("router: %v", err)
	}
	if ws, err := in.Workers(context.Background()); err != nil || len(ws) != 0 {
		t.Fatalf("workers after a clean stop = %+v, %v", ws, err)
	}
	streams, err = in.Streams(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range streams { // the router may also have deleted its idle consumers
		for _, c := range s.Groups[0].Consumers {
			if c.State != inspect.ConsumerNoBeat {
				t.Errorf("consumer after a clean stop = %+v", c)
			}
		}
	}

	// A killed worker's beat is left to expire: dead, with when it was last seen.
	bctx := context.Background()
	c9s := e.Topology.Stream("rebase", "c9s", false)
	now, _ := e.Client.Time(bctx).Result()
	beat, _ := json.Marshal(presence.Beat{Consumer: "w7-0", Stream: c9s, Group: "rebase-c9s", Agent: "rebase", Host: "h", PID: 7})
	e.Client.ZAdd(bctx, e.Topology.Workers(), redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: string(beat)})
	e.publishTo(c9s, event.RebaseRequested, "RHEL-7")
	e.readAs(c9s, "rebase-c9s", "w7-0", 1)
	streams, _ = in.Streams(bctx)
	var dead *inspect.ConsumerInfo
	for _, s := range streams {
		if s.Stream == c9s {
			dead = &s.Groups[0].Consumers[0]
		}
	}
	if dead == nil || dead.Name != "w7-0" || dead.State != inspect.ConsumerDead || dead.LastSeen == nil || dead.Process != "h pid 7" {
		t.Fatalf("killed worker = %+v in %+v", dead, streams)
	}
}

// An entry a live worker read ahead, behind the one it runs, is "queued behind" that
// entry, not orphaned; the same entry of a consumer with no presence is orphaned.
func TestPendingShowsReadAheadEntriesAsQueued(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first := e.PublishTriage("RHEL-1")
	second := e.PublishTriage("RHEL-2")
	e.StartTriage(ctx, pipelinetest.TriageOptions{}, func(msg *message.Message) error {
		if issueOf(msg) == "RHEL-1" {
			once.Do(func() { close(running) })
			<-release
		}
		return nil
	})
	defer close(release)
	<-running
	in := e.inspector(nil, 0)
	var g inspect.GroupPending
	redistest.Eventually(t, 10*time.Second, func() bool {
		groups, err := in.Pending(ctx, inspect.PendingFilter{Agent: "triage"})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range groups {
			if x.Stream == e.TriageStream() && len(x.Entries) == 2 {
				g = x
				return true
			}
		}
		return false
	}, "both entries pending")
	if g.Entries[0].ID != first || g.Entries[0].State != inspect.StateGuarded {
		t.Errorf("running entry = %+v", g.Entries[0])
	}
	q := g.Entries[1]
	if q.ID != second || q.State != inspect.StateQueued || !strings.HasPrefix(q.Note, "queued behind "+first+" on a live worker (") {
		t.Errorf("read-ahead entry = %+v", q)
	}
}

// On the embedded miniredis, which answers no idle times and the stream's length as
// the lag, both are reported unknown (?), not as lag = length and idle -1ms.
func TestStreamsOnTheEmbeddedRedisSayUnknown(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DisableIdentity: true})
	defer rdb.Close()
	ctx := context.Background()
	topo := event.Topology{}
	stream := topo.Stream("triage", "", false)
	for _, k := range []string{"RHEL-1", "RHEL-2"} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"issue_key": k}})
	}
	rdb.XGroupCreate(ctx, stream, "triage", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "w1-0", Streams: []string{stream, ">"}, Count: 1})
	locker, _ := lease.New(rdb, lease.Options{})
	in, err := inspect.New(inspect.Config{Client: rdb, Topology: topo, Locker: locker})
	if err != nil {
		t.Fatal(err)
	}
	streams, err := in.Streams(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g := streams[0].Groups[0]
	if g.Lag != -1 || len(g.Consumers) != 1 || g.Consumers[0].Idle >= 0 {
		t.Fatalf("group on miniredis = %+v", g)
	}
	b, _ := json.Marshal(g.Consumers[0])
	if !strings.Contains(string(b), `"idle_ms":-1`) {
		t.Errorf("JSON %s", b)
	}
}
