package lockmw_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A supersede rule in a table whose other rules coalesce or deliver (one worker's
// ON_CONFLICT, e.g. triage.requested=drop,rebase.requested=coalesce,*=supersede): the
// event runs. (Found by the integration suite's mixed-policy scenario: the take-over
// acquire was refused for the drain the coalesce rule turns on, and the event was
// redelivered forever.)
func TestSupersedeBesideCoalesceRuns(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	src := pendingSource(t, rdb, ns)
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
		Policies: lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Supersede},
			ByType: map[string]lockmw.Rule{"other.requested": {Policy: lockmw.Coalesce}}}})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	if _, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
		t.Fatalf("supersede beside coalesce: %v", err)
	}
	if !ran {
		t.Fatal("the event did not run")
	}
	if p := rdb.XPending(context.Background(), src.entry.Stream, "g").Val(); p.Count != 0 {
		t.Errorf("not acked: %+v", p)
	}
}

// A drop event on a key left free by a take-over that was given back (its worker
// stopped while it waited) before the run it superseded had stopped: the event runs only
// once that run has stopped, never beside it, whether its own worker's rules supersede
// or not (first found by the lease's model checker for a worker with a supersede rule;
// a worker without one, as in a rolling change of ON_CONFLICT, once read no stop record
// at all).
func TestRunWaitsForARunSupersededByAGivenBackTakeOver(t *testing.T) {
	t.Parallel()
	for name, byType := range map[string]map[string]lockmw.Rule{
		"a worker with a supersede rule": {"rebase.requested": {Policy: lockmw.Supersede}},
		"a worker without one":           nil,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runWaitsForAGivenBackTakeOver(t, lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Drop}, ByType: byType})
		})
	}
}

// runWaitsForAGivenBackTakeOver runs TestRunWaitsForARunSupersededByAGivenBackTakeOver
// with the drop event's worker's rules.
func runWaitsForAGivenBackTakeOver(t *testing.T, rules lockmw.Policies) {
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := locker(t, rdb, ns)
	old, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1000-0", Supersede: true})
	if err != nil {
		t.Fatal(err)
	}
	taker, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1000-1", Supersede: true})
	if err != nil || taker.Supersedes() != "1000-0" {
		t.Fatalf("take-over: %v", err)
	}
	if err := taker.GiveBack(ctx); err != nil {
		t.Fatal(err)
	}
	src := pendingSource(t, rdb, ns)
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
		Policies: rules})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	done := make(chan error, 1)
	h := mw(func(*message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil })
	go func() {
		_, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`)))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the event ended (ran %v, %v) while the superseded run had not stopped", ran.Load(), err)
	case <-time.After(300 * time.Millisecond):
	}
	if ran.Load() {
		t.Fatal("the event ran beside the superseded run")
	}
	if _, err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || !ran.Load() {
			t.Fatalf("after the old run stopped: ran %v, %v", ran.Load(), err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the event did not run after the superseded run stopped")
	}
}
