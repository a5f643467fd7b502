package pipeline_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// delayRun is one run of a delayed event, as its handler saw it.
type delayRun struct {
	at                   time.Time
	correlation, attempt string
	delays, delayedFrom  string
}

// delayRouter is a triage router whose busy policy is delay, recording its runs.
func delayRouter(e *pipelinetest.Env, consumer string, l *lease.Locker, policy string, runs chan<- delayRun) pipeline.RouterConfig {
	pol, err := lockmw.ParsePolicies(policy)
	if err != nil {
		panic(err)
	}
	cfg := e.Config("triage", "", consumer, l, func(msg *message.Message) error {
		runs <- delayRun{at: time.Now(), correlation: msg.Metadata.Get(event.MetaCorrelationID), attempt: msg.Metadata.Get(event.MetaAttempt),
			delays: msg.Metadata.Get(event.MetaDelays), delayedFrom: msg.Metadata.Get(event.MetaDelayedFrom)}
		return nil
	})
	cfg.Policies = pol
	return cfg
}

// An event meeting a busy lease under delay:D is acked and re-queued: it runs once the
// delay has passed and the lease is free, never before its delay, with its correlation id
// and attempt count, and a lock.delayed record says until when.
func TestDelayRunsAfterTheDelay(t *testing.T) {
	// Not parallel: it times the delay.
	e := pipelinetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := e.TriageLocker(3 * time.Second)
	holder, err := l.Acquire(ctx, "triage", "RHEL-50", lease.AcquireOptions{Owner: "other"})
	if err != nil {
		t.Fatal(err)
	}
	runs := make(chan delayRun, 10)
	const d = 400 * time.Millisecond
	e.Start(ctx, delayRouter(e, "w1", l, "triage.requested=delay:400ms", runs))
	sent := time.Now()
	id := e.PublishTriage("RHEL-50")
	corr := e.Entries(e.TriageStream())[0].Values["m:"+event.MetaCorrelationID]

	redistest.Eventually(t, 5*time.Second, func() bool { return len(e.Records(event.LockDelayed)) == 1 }, "no lock.delayed record")
	rec := e.Records(event.LockDelayed)[0].Values
	until, err := time.Parse(time.RFC3339Nano, rec["delayed_until"].(string))
	if err != nil || until.Before(sent.Add(d)) || rec["delays"] != "1" || rec["message_id"] != id {
		t.Fatalf("record %v: delayed_until %v must be at least %v after the publish", rec, until, d)
	}
	if n := e.Pending(e.TriageStream(), e.Topology.Group("triage", "")); n != 0 {
		t.Fatalf("the delayed entry is still pending (%d)", n)
	}
	waiting, err := delayq.List(ctx, e.Client, e.TriageStream(), 0)
	if err != nil || len(waiting) != 1 || waiting[0].IssueKey != "RHEL-50" || waiting[0].Delays != 1 || !waiting[0].Until.Equal(until.Truncate(time.Millisecond)) {
		t.Fatalf("delayed set: %+v %v (until %v)", waiting, err, until)
	}
	_, _ = holder.Release(ctx)

	select {
	case r := <-runs:
		if r.at.Before(until) {
			t.Errorf("ran at %v, before its delayed_until %v", r.at, until)
		}
		if r.correlation != corr || r.attempt != "1" || r.delays != "1" || r.delayedFrom != id {
			t.Errorf("run %+v: want correlation %v, attempt 1 (its first, as the published event would have had), delays 1, delayed_from %s", r, corr, id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the delayed event never ran")
	}
	select {
	case r := <-runs:
		t.Fatalf("a second run: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	if w, _ := delayq.List(ctx, e.Client, e.TriageStream(), 0); len(w) != 0 {
		t.Errorf("still delayed: %+v", w)
	}
}

// A delayed event survives its worker: the worker stops before the event is due, another
// one (a new process in production: nothing is kept in memory) promotes and runs it once.
// A second delay of the same event waits twice as long.
func TestDelaySurvivesRestartAndDoubles(t *testing.T) {
	// Not parallel: it times the delays.
	e := pipelinetest.New(t)
	l := e.TriageLocker(3 * time.Second)
	bg := context.Background()
	holder, err := l.Acquire(bg, "triage", "RHEL-51", lease.AcquireOptions{Owner: "other"})
	if err != nil {
		t.Fatal(err)
	}
	runs := make(chan delayRun, 10)
	ctx1, stop1 := context.WithCancel(bg)
	_, done1 := e.Start(ctx1, delayRouter(e, "w1", l, "delay:300ms", runs))
	e.PublishTriage("RHEL-51")
	redistest.Eventually(t, 5*time.Second, func() bool { return len(e.Records(event.LockDelayed)) == 1 }, "not delayed")
	stop1()
	if err := <-done1; err != nil {
		t.Fatalf("first worker: %v", err)
	}

	// Still busy when the second worker promotes it: delayed again, for twice as long.
	ctx2, stop2 := context.WithCancel(bg)
	defer stop2()
	e.Start(ctx2, delayRouter(e, "w2", l, "delay:300ms", runs))
	redistest.Eventually(t, 5*time.Second, func() bool { return len(e.Records(event.LockDelayed)) == 2 }, "not delayed a second time")
	second := e.Records(event.LockDelayed)[1].Values
	at, _ := time.Parse(time.RFC3339Nano, second["at"].(string))
	until, _ := time.Parse(time.RFC3339Nano, second["delayed_until"].(string))
	if second["delays"] != "2" || until.Sub(at) < 600*time.Millisecond {
		t.Fatalf("second delay %v: want delays 2 and at least 600ms (%v)", second, until.Sub(at))
	}
	_, _ = holder.Release(bg)
	select {
	case r := <-runs:
		if r.delays != "2" || r.at.Before(until) {
			t.Errorf("run %+v (due %v)", r, until)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lost across the restart")
	}
	select {
	case r := <-runs:
		t.Fatalf("a second run: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
}

// Promoting is safe to repeat: the append's reply is lost once (go-redis sends it
// again; the append took the member in the same step); the event is appended once, and
// the same member delayed again within the marker's TTL (a redelivery of its entry)
// appends nothing either.
func TestPromoteSafeToRepeat(t *testing.T) {
	t.Parallel()
	direct, ns := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	rdb := proxy.Client(direct.Options())
	ctx := context.Background()
	stream := ns + "s"
	member, err := delayq.Member("1-1", map[string]any{"payload": "{}", "m:issue_key": "RHEL-1"})
	if err != nil {
		t.Fatal(err)
	}
	key := delayq.Key(stream)
	direct.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: member})
	once, err := os.ReadFile("../internal/xonce/xadd_once.lua")
	if err != nil {
		t.Fatal(err)
	}
	direct.ScriptLoad(ctx, string(once)) // the lost reply is the append's, not a NOSCRIPT
	proxy.LoseReply(redistest.Script(string(once)), 1)
	n, next, err := delayq.Promote(ctx, rdb, stream)
	if err != nil || n != 1 || proxy.Cuts() != 1 {
		t.Fatalf("promote: moved %d, %v (cuts %d)", n, err, proxy.Cuts())
	}
	if got := direct.XLen(ctx, stream).Val(); got != 1 {
		t.Fatalf("%d entries after a repeated promote, want 1", got)
	}
	if !next.IsZero() || direct.ZCard(ctx, key).Val() != 0 {
		t.Errorf("left delayed: next %v", next)
	}
	// The member is back (its entry delayed again): promoting it again appends nothing
	// more, and removes it.
	direct.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: member})
	if n, _, err := delayq.Promote(ctx, direct, stream); err != nil || n != 1 || direct.XLen(ctx, stream).Val() != 1 || direct.ZCard(ctx, key).Val() != 0 {
		t.Errorf("a second promotion of one member: moved %d, %v, %d entries", n, err, direct.XLen(ctx, stream).Val())
	}
	// Not due yet: not promoted.
	direct.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: member})
	if n, next, err := delayq.Promote(ctx, direct, stream); err != nil || n != 0 || next.IsZero() {
		t.Errorf("an event due in an hour: moved %d, next %v, %v", n, next, err)
	}
	// The promoted entry is in the issue's index, like every append.
	if ids := direct.ZRange(ctx, xonce.IndexKey(stream, "RHEL-1"), 0, -1).Val(); len(ids) != 1 {
		t.Errorf("index of RHEL-1: %v", ids)
	}
}

// A promoter that dies between a delayed event's append and its removal, and a
// promotion that resumes after the append's marker has expired (xonce.DefaultTTL, an
// hour: every worker of the stream down that long), still leaves one copy: the append
// and the removal are one step, so no member outlives the append it made.
func TestPromoteResumedAfterTheMarkerExpiredAppendsOnce(t *testing.T) {
	t.Parallel()
	direct, ns := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	opts := *direct.Options()
	opts.Addr, opts.MaxRetries = proxy.Addr(), -1 // no retry: the promoter is gone
	rdb := redis.NewClient(&opts)
	defer rdb.Close()
	ctx := context.Background()
	stream := ns + "s"
	member, err := delayq.Member("1-1", map[string]any{"payload": "{}", "m:issue_key": "RHEL-1"})
	if err != nil {
		t.Fatal(err)
	}
	key := delayq.Key(stream)
	direct.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: member})
	once, err := os.ReadFile("../internal/xonce/xadd_once.lua")
	if err != nil {
		t.Fatal(err)
	}
	direct.ScriptLoad(ctx, string(once)) // the lost reply is the append's, not a NOSCRIPT
	proxy.LoseReply(redistest.Script(string(once)), 1)
	if _, _, err := delayq.Promote(ctx, rdb, stream); err == nil {
		t.Fatal("promote survived its lost reply; the crash was not simulated")
	}
	if got := direct.XLen(ctx, stream).Val(); got != 1 {
		t.Fatalf("%d entries after the append ran, want 1", got)
	}
	// An hour passes: the append's marker expires.
	markers := direct.Keys(ctx, "{"+stream+"}:once:*").Val()
	if len(markers) != 1 {
		t.Fatalf("markers %v, want one", markers)
	}
	direct.Del(ctx, markers...)
	if _, _, err := delayq.Promote(ctx, direct, stream); err != nil {
		t.Fatal(err)
	}
	if got := direct.XLen(ctx, stream).Val(); got != 1 {
		t.Errorf("%d copies of one delayed event after promotion resumed past the marker's TTL, want 1", got)
	}
	if n := direct.ZCard(ctx, key).Val(); n != 0 {
		t.Errorf("%d members left delayed", n)
	}
}
