package lockmw_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// drainEnv is one stream of one agent ("rebase") under a policy table, with an entry
// per event read by consumer c.
type drainEnv struct {
	t        *testing.T
	rdb      *redis.Client
	ns       string
	stream   string
	l        *lease.Locker
	policies lockmw.Policies
}

func newDrainEnv(t *testing.T, policies string) *drainEnv {
	t.Helper()
	rdb, ns := redistest.Client(t)
	p, err := lockmw.ParsePolicies(policies)
	if err != nil {
		t.Fatal(err)
	}
	return &drainEnv{t: t, rdb: rdb, ns: ns, stream: ns + "s", l: locker(t, rdb, ns), policies: p}
}

// event reads a new entry of the stream (as the subscription would) and returns its
// message (of eventType, "" for the default rule's) and the handler to run it with,
// under locker l.
func (e *drainEnv) event(l *lease.Locker, eventType, name string) (*message.Message, func(message.HandlerFunc) message.HandlerFunc) {
	e.t.Helper()
	id := pendingEntry(e.t, e.rdb, e.stream, "c")
	src := &streamSource{entry: lockmw.Entry{Stream: e.stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src,
		MaxIdleTime: time.Hour, Policies: e.policies})
	if err != nil {
		e.t.Fatal(err)
	}
	msg := message.NewMessage(name, []byte(`{"metadata":{"issue":"RHEL-1"},"name":"`+name+`"}`))
	if eventType != "" {
		msg.Metadata.Set(event.MetaEventType, eventType)
	}
	return msg, func(h message.HandlerFunc) message.HandlerFunc { return mw(h) }
}

// blocked runs msg in the background with a handler that waits for proceed; started
// is closed once the handler runs, and the returned channel gets the handler's error.
func blocked(msg *message.Message, mw func(message.HandlerFunc) message.HandlerFunc, started, proceed chan struct{}) chan error {
	done := make(chan error, 1)
	h := mw(func(*message.Message) ([]*message.Message, error) {
		close(started)
		<-proceed
		return nil, nil
	})
	go func() { _, err := h(msg); done <- err }()
	return done
}

// mustNotRun runs msg, which must meet the holder (a conflict), not run.
func mustNotRun(t *testing.T, msg *message.Message, mw func(message.HandlerFunc) message.HandlerFunc) {
	t.Helper()
	ran := false
	if _, err := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(msg); err != nil || ran {
		t.Fatalf("%s: ran %v, %v; want it queued behind the holder", msg.UUID, ran, err)
	}
}

// followUpPublished checks that the stream's last entry is the follow-up of name, the
// stream holds want entries, and the issue's queue is gone.
func (e *drainEnv) followUpPublished(name string, want int64) {
	e.t.Helper()
	ctx := context.Background()
	last := e.rdb.XRevRangeN(ctx, e.stream, "+", "-", 1).Val()
	if n := e.rdb.XLen(ctx, e.stream).Val(); n != want || len(last) == 0 ||
		last[0].Values["payload"] != `{"metadata":{"issue":"RHEL-1"},"name":"`+name+`"}` {
		e.t.Fatalf("stream holds %d entries, last %v; want %d, the last %s's follow-up: it was stranded", n, last, want, name)
	}
	if exists(e.t, e.rdb, e.l.Keys("rebase", "RHEL-1").Queue) {
		e.t.Fatal("the issue's queue is still there")
	}
}

// ON_CONFLICT *=supersede beside a coalesce rule: an event of the coalesce rule that
// meets a supersede holder is queued (and acked) behind it, and the holder's release
// publishes it. Issue 34, item 3.
func TestCoalesceBehindSupersedeHolderIsPublished(t *testing.T) {
	t.Parallel()
	e := newDrainEnv(t, "other.requested=coalesce,*=supersede")
	s, mwS := e.event(e.l, "", "s")
	b, mwB := e.event(e.l, "other.requested", "b")
	started, proceed := make(chan struct{}), make(chan struct{})
	done := blocked(s, mwS, started, proceed)
	<-started
	mustNotRun(t, b, mwB)
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.followUpPublished("b", 3)
}

// A supersede event takes the issue over from a coalesce run with a follow-up queued
// behind it: the follow-up is published once the newer run has released, not stranded
// with the old holder (whose key it no longer is). Issue 34, item 3.
func TestTakeOverOfDrainingHolderPublishesItsQueue(t *testing.T) {
	t.Parallel()
	e := newDrainEnv(t, "rebase.requested=supersede,*=coalesce")
	h, mwH := e.event(e.l, "", "h")
	b, mwB := e.event(e.l, "", "b")
	s, mwS := e.event(e.l, "rebase.requested", "s")
	startedH, proceedH := make(chan struct{}), make(chan struct{})
	doneH := blocked(h, mwH, startedH, proceedH)
	<-startedH
	mustNotRun(t, b, mwB)
	startedS, proceedS := make(chan struct{}), make(chan struct{})
	close(proceedS)
	doneS := blocked(s, mwS, startedS, proceedS)
	info := e.l.Keys("rebase", "RHEL-1").Info
	redistest.Eventually(t, 5*time.Second, func() bool {
		return e.rdb.HGet(context.Background(), info, "supersedes").Val() != ""
	}, "s took the issue over")
	close(proceedH) // the old run stops (it had not heard of the take-over: its outcome stands)
	if err := <-doneH; err != nil {
		t.Fatal(err)
	}
	if err := <-doneS; err != nil {
		t.Fatal(err)
	}
	<-startedS
	e.followUpPublished("b", 4)
}

// A lease of a draining subscription (ON_CONFLICT comment.created=deliver,*=drop) that
// the replicas did not acknowledge is given back, not recorded as a run: an event of
// the issue that entered before it is not dropped as superseded by a run that never
// happened. Issue 34, item 1.
func TestNotReplicatedDrainingLeaseIsNoRun(t *testing.T) {
	t.Parallel()
	e := newDrainEnv(t, "comment.created=deliver,*=drop")
	// No replica is connected to the test server: WAIT answers 0.
	lw, err := lease.New(e.rdb, lease.Options{Scope: e.ns, TTL: 30 * time.Second, WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d, mwD := e.event(e.l, "", "d")
	first, mwFirst := e.event(lw, "", "first")
	ctx := context.Background()
	// The superseded check has millisecond resolution: give back in a later one.
	redistest.Eventually(t, 5*time.Second, func() bool {
		return e.rdb.Time(ctx).Val().UnixMilli() > streamMS(e.rdb.XRange(ctx, e.stream, "-", "+").Val()[0].ID)
	}, "Redis clock past d's entry")
	ran := false
	run := func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil }
	if _, err := mwFirst(run)(first); !errors.Is(err, lease.ErrNotReplicated) || ran {
		t.Fatalf("not acknowledged: ran %v, %v; want it given back and redelivered", ran, err)
	}
	if done := e.l.Keys("rebase", "RHEL-1").Done; exists(t, e.rdb, done) {
		t.Fatalf("the give-back wrote %s = %q: a run that never happened", done, e.rdb.Get(ctx, done).Val())
	}
	if _, err := mwD(run)(d); err != nil || !ran {
		t.Fatalf("d, which entered before the given-back lease: ran %v, %v; want it run", ran, err)
	}
}

// A supersede take-over whose wait for the old run ends first (its worker shuts down)
// gives the lease back: no run happened under it, so it records none, and an event of
// the issue that entered before it still runs. Issue 34, item 1 (the give-back class).
func TestTakeOverStoppedWaitingIsNoRun(t *testing.T) {
	t.Parallel()
	e := newDrainEnv(t, "rebase.requested=supersede,*=drop")
	h, mwH := e.event(e.l, "", "h")
	d, mwD := e.event(e.l, "", "d")
	s, mwS := e.event(e.l, "rebase.requested", "s")
	ctx := context.Background()
	startedH, proceedH := make(chan struct{}), make(chan struct{})
	doneH := blocked(h, mwH, startedH, proceedH)
	<-startedH
	// The superseded check has millisecond resolution: give back in a later one.
	dID := e.rdb.XRange(ctx, e.stream, "-", "+").Val()[1].ID
	redistest.Eventually(t, 5*time.Second, func() bool {
		return e.rdb.Time(ctx).Val().UnixMilli() > streamMS(dID)
	}, "Redis clock past d's entry")
	sctx, shutdown := context.WithCancel(ctx)
	s.SetContext(sctx)
	startedS, proceedS := make(chan struct{}), make(chan struct{})
	close(proceedS)
	doneS := blocked(s, mwS, startedS, proceedS)
	info := e.l.Keys("rebase", "RHEL-1").Info
	redistest.Eventually(t, 5*time.Second, func() bool {
		return e.rdb.HGet(ctx, info, "supersedes").Val() != ""
	}, "s took the issue over")
	shutdown()
	if err := <-doneS; err == nil {
		t.Fatal("s, whose wait was cut short, returned no error: its entry would be acked without a run")
	}
	select {
	case <-startedS:
		t.Fatal("s ran before the old run stopped")
	default:
	}
	if done := e.l.Keys("rebase", "RHEL-1").Done; exists(t, e.rdb, done) {
		t.Fatalf("the give-back wrote %s = %q: a run that never happened", done, e.rdb.Get(ctx, done).Val())
	}
	close(proceedH)
	if err := <-doneH; err != nil {
		t.Fatal(err)
	}
	ran := false
	if _, err := mwD(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(d); err != nil || !ran {
		t.Fatalf("d, which entered before the given-back take-over: ran %v, %v; want it run", ran, err)
	}
}
