package handlers_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/runners"
)

// published appends msg to stream and stamps it as a stream reader does (entry id and
// stream), as every delivery of that entry is stamped.
func (e *env) published(msg *message.Message, stream string) *message.Message {
	e.t.Helper()
	id, err := e.pub.PublishID(context.Background(), stream, msg)
	if err != nil {
		e.t.Fatal(err)
	}
	msg.Metadata.Set(event.FieldEntryID, id)
	msg.Metadata.Set(event.FieldEntryStream, stream)
	return msg
}

// redelivery is a fresh copy of msg, as a redelivery reads it again from its stream.
func redelivery(msg *message.Message) *message.Message {
	c := msg.Copy()
	c.UUID = msg.UUID
	return c
}

// An event whose ack failed after its stage.done (or whose dead letter failed after its
// stage.failed) is redelivered to another worker, which never saw it: that worker reads
// the outcome record in Redis and settles the event without running the agent, and
// the event keeps its one terminal record.
func TestRedeliveryToAnotherWorkerSettlesFromTheRecord(t *testing.T) {
	t.Parallel()
	t.Run("done", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, fakejira.Issue{Key: "RHEL-33", Labels: []string{"ymir_triaged_backport"}})
		r := &fixed{res: runners.Result{Success: true, MergeRequestURL: "https://mr/33"}}
		a, b := e.handler("backport", "c10s", r), e.handler("backport", "c10s", r)
		msg := e.published(downstreamMsg(t, "backport", "RHEL-33", "rhel-10.1", false), e.topo.Stream("backport", "c10s", false))
		if err := attempt(a, msg, 1); err != nil {
			t.Fatal(err)
		}
		if err := attempt(b, redelivery(msg), 1); err != nil {
			t.Fatalf("redelivered to another worker: %v", err)
		}
		if r.n() != 1 {
			t.Fatalf("runner ran %d times, want 1", r.n())
		}
		if recs := e.recordsOf("RHEL-33", "backport"); len(recs) != 1 || recs[0]["event_type"] != event.StageDone {
			t.Fatalf("records %v, want one stage.done", recs)
		}
	})
	t.Run("failed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, fakejira.Issue{Key: "RHEL-34", Labels: []string{"ymir_retry_needed"}})
		r := &fixed{err: errors.New("agent crashed")}
		a, b := e.handler("triage", "", r), e.handler("triage", "", r)
		msg := e.published(triageMsg(t, "RHEL-34", false, ""), e.topo.Stream("triage", "", false))
		for n := 1; n <= 3; n++ {
			_ = attempt(a, msg, n)
		}
		err := attempt(b, redelivery(msg), 1)
		if !errors.Is(err, event.ErrOutcomeRecorded) {
			t.Fatalf("redelivered to another worker: %v, want the recorded failure (dead letter again)", err)
		}
		if r.n() != 3 {
			t.Fatalf("runner ran %d times, want 3", r.n())
		}
		if recs := e.recordsOf("RHEL-34", "triage"); len(recs) != 1 || recs[0]["event_type"] != event.StageFailed {
			t.Fatalf("records %v, want one stage.failed", recs)
		}
	})
}

// The same worker's memory of ended events is bounded (Config.EndedCache): an event
// redelivered after more other events than that ended is still settled from its
// record, not run again.
func TestRedeliveryAfterTheEndedCacheForgotItSettles(t *testing.T) {
	t.Parallel()
	var issues []fakejira.Issue
	for i := range 4 {
		issues = append(issues, fakejira.Issue{Key: "RHEL-" + strconv.Itoa(50+i), Labels: []string{"ymir_triaged_backport"}})
	}
	e := newEnv(t, issues...)
	r := &fixed{res: runners.Result{Success: true}}
	h := e.handler("backport", "c10s", r, func(c *handlers.Config) { c.EndedCache = 2 })
	stream := e.topo.Stream("backport", "c10s", false)
	first := e.published(downstreamMsg(t, "backport", "RHEL-50", "rhel-10.1", false), stream)
	if err := attempt(h, first, 1); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if err := attempt(h, e.published(downstreamMsg(t, "backport", "RHEL-"+strconv.Itoa(50+i), "rhel-10.1", false), stream), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := attempt(h, redelivery(first), 1); err != nil {
		t.Fatalf("redelivered after the cache forgot it: %v", err)
	}
	if r.n() != 4 {
		t.Fatalf("runner ran %d times for 4 events, want 4", r.n())
	}
	if recs := e.recordsOf("RHEL-50", "backport"); len(recs) != 1 {
		t.Fatalf("records %v, want one stage.done", recs)
	}
}

// mailboxRunner is an agent that takes every follow-up its run is fed while it runs
// (added by during, before it looks) and acknowledges them all.
type mailboxRunner struct {
	mu     sync.Mutex
	calls  int
	during func(ctx context.Context, req runners.RunRequest)
}

func (m *mailboxRunner) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	m.mu.Lock()
	m.calls++
	m.mu.Unlock()
	if m.during != nil {
		m.during(ctx, req)
	}
	res := runners.Result{Success: true}
	if req.Mailbox == nil {
		return res, nil
	}
	fs, err := req.Mailbox.Next(ctx)
	if err != nil {
		return res, err
	}
	for _, f := range fs {
		res.Delivered = append(res.Delivered, f.ID)
		res.FollowupsAcked = append(res.FollowupsAcked, f.ID)
	}
	return res, nil
}

func (m *mailboxRunner) n() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// followup appends a follow-up to the mailbox of (agent, key) as the deliver policy's
// acquire does, and returns its id.
func (e *env) followup(agent, key, commentID string) string {
	e.t.Helper()
	id, err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.locker().Keys(agent, key).Mailbox,
		Values: map[string]any{"event_type": event.CommentCreated, "comment_id": commentID, "author": "ann", "body": "more"}}).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// The follow-ups a run accounted for (two it started with, one it acknowledged while it
// ran) cannot be recorded on its first attempt (the results stream refuses the write).
// The retry records them, without running the agent again: each follow-up ends with
// exactly one record, none is left in the mailbox or lost, and the event has one
// stage.done.
func TestFailedFollowupRecordNeitherLosesItNorRerunsTheAgent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-60", Labels: []string{"ymir_triaged_backport"}})
	ctx := context.Background()
	earlier := []string{e.followup("backport", "RHEL-60", "1"), e.followup("backport", "RHEL-60", "2")}
	var live string
	var once sync.Once
	r := &mailboxRunner{during: func(context.Context, runners.RunRequest) {
		once.Do(func() {
			live = e.followup("backport", "RHEL-60", "3")
			// The results stream refuses every write until the test repairs it.
			e.rdb.Set(ctx, e.topo.Results(), "not a stream", 0)
		})
	}}
	h := e.handler("backport", "c10s", r, func(c *handlers.Config) { c.Mailbox = true })
	mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: e.locker(), Agent: "backport"})
	if err != nil {
		t.Fatal(err)
	}
	msg := e.published(downstreamMsg(t, "backport", "RHEL-60", "rhel-10.1", false), e.topo.Stream("backport", "c10s", false))
	var first error
	_, err = mw.Handler(func(m *message.Message) ([]*message.Message, error) {
		// The pipeline's retry, inside the lease.
		if first = attempt(h, m, 1); first == nil {
			return nil, nil
		}
		e.rdb.Del(ctx, e.topo.Results())
		return nil, attempt(h, m, 2)
	})(msg)
	if first == nil || err != nil {
		t.Fatalf("first attempt %v (want the refused record), retry %v", first, err)
	}
	if r.n() != 1 {
		t.Fatalf("agent ran %d times, want 1", r.n())
	}
	want := map[string]string{earlier[0]: event.FollowupRolled, earlier[1]: event.FollowupRolled, live: event.FollowupDelivered}
	got := map[string][]string{}
	for _, rec := range e.records("") {
		if et := rec["event_type"].(string); et == event.FollowupRolled || et == event.FollowupDelivered {
			got[rec["outcome"].(string)] = append(got[rec["outcome"].(string)], et)
		}
	}
	for id, et := range want {
		if len(got[id]) != 1 || got[id][0] != et {
			t.Errorf("follow-up %s: records %v, want one %s", id, got[id], et)
		}
	}
	if len(got) != len(want) {
		t.Errorf("follow-up records %v, want %v", got, want)
	}
	if n := e.rdb.XLen(ctx, e.locker().Keys("backport", "RHEL-60").Mailbox).Val(); n != 0 {
		t.Errorf("%d follow-ups left in the mailbox", n)
	}
	if recs := e.records(event.StageDone); len(recs) != 1 {
		t.Errorf("stage.done records %v, want one", recs)
	}
}

// A worker records stage.done and then loses Redis before its ack (its connection goes
// through a proxy that is cut right after the record): the entry stays pending, and
// once the worker's lease has expired another worker claims it. That worker never saw
// the event: it settles it from the outcome record, without running the agent, and acks
// it. One run, one stage.done, nothing pending.
func TestAckLostAfterStageDoneRedeliveredToAnotherWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-70", Labels: []string{"ymir_triaged_backport"}})
	ctx := context.Background()
	r := &fixed{res: runners.Result{Success: true, MergeRequestURL: "https://mr/70"}}
	proxy := redistest.NewLossyProxy(t, e.rdb.Options().Addr)
	aOpts := *e.rdb.Options()
	aOpts.Addr = proxy.Addr()
	aClient := redis.NewClient(&aOpts)
	t.Cleanup(func() { _ = aClient.Close() })
	hA, err := handlers.New(handlers.Config{Agent: "backport", Branch: "c10s", Runner: r, Jira: e.jc, Publisher: event.NewPublisher(aClient, 0),
		Results: event.NewResults(aClient, e.topo.Results(), 0), Topology: e.topo, MaxRetries: 2, Logger: e.log})
	if err != nil {
		t.Fatal(err)
	}
	lockerA, err := lease.New(aClient, lease.Options{Scope: e.topo.LockScope(), TTL: 3 * time.Second, Owner: "wA"})
	if err != nil {
		t.Fatal(err)
	}
	cfgA := e.Config("backport", "c10s", "wA", lockerA, func(m *message.Message) error {
		err := hA(m)
		if err == nil {
			proxy.Close() // Redis is gone for worker A from here on: its ack never arrives
		}
		return err
	})
	aOptsU := *e.opts
	aOptsU.Addrs = []string{proxy.Addr()}
	cfgA.Client, cfgA.ClientOptions, cfgA.Logger = aClient, &aOptsU, e.log
	actx, stopA := context.WithCancel(ctx)
	defer stopA()
	e.Start(actx, cfgA)

	stream := e.topo.Stream("backport", "c10s", false)
	if _, err := e.pub.PublishID(ctx, stream, downstreamMsg(t, "backport", "RHEL-70", "rhel-10.1", false)); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 20*time.Second, func() bool { return len(e.records(event.StageDone)) == 1 }, "worker A records stage.done")
	stopA()
	e.router(ctx, "backport", "c10s", e.handler("backport", "c10s", r), 2)
	redistest.Eventually(t, 30*time.Second, func() bool { return e.Pending(stream, e.topo.Group("backport", "c10s")) == 0 },
		"worker B claims and settles the entry")
	if r.n() != 1 {
		t.Fatalf("agent ran %d times, want 1", r.n())
	}
	if recs := e.recordsOf("RHEL-70", "backport"); len(recs) != 1 || recs[0]["event_type"] != event.StageDone {
		t.Fatalf("records %v, want one stage.done", recs)
	}
	if d := e.Dead(); len(d) != 0 {
		t.Fatalf("dead letters %v", d)
	}
}
