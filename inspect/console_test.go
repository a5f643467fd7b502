package inspect_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The console's reads: outcomes per minute, the running leases with their stream, the
// newest dead letters, and the purge of selected ones.

func TestOutcomesCountPerMinuteAndType(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 4, 12, 30, 30, 0, time.UTC)
	in, err := inspect.New(inspect.Config{Client: e.Client, Topology: e.Topology, Locker: e.TriageLocker(time.Minute), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	add := func(at time.Time, seq int, typ string) {
		if err := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Results(), ID: fmt.Sprintf("%d-%d", at.UnixMilli(), seq),
			Values: map[string]any{"event_type": typ}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add(now.Add(-2*time.Hour), 0, "stage.done") // outside the window
	add(now.Add(-10*time.Minute), 0, "stage.done")
	add(now.Add(-10*time.Minute), 1, "stage.done")
	add(now.Add(-10*time.Minute), 2, "stage.failed")
	add(now.Add(-time.Second), 0, "lock.dropped")
	o, err := in.Outcomes(ctx, time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if o.Total != 4 || len(o.Buckets) != 61 || fmt.Sprint(o.Types) != "[lock.dropped stage.done stage.failed]" {
		t.Fatalf("outcomes: total %d, %d buckets, types %v", o.Total, len(o.Buckets), o.Types)
	}
	b := o.Buckets[len(o.Buckets)-1-10]
	if !b.Start.Equal(now.Add(-10*time.Minute).Truncate(time.Minute)) || b.Counts["stage.done"] != 2 || b.Counts["stage.failed"] != 1 || b.Total != 3 {
		t.Fatalf("bucket 10 minutes ago: %+v", b)
	}
	if last := o.Buckets[len(o.Buckets)-1]; last.Counts["lock.dropped"] != 1 {
		t.Fatalf("current bucket: %+v", last)
	}
}

func TestRunningNamesTheStreamOfTheGuardedEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	locker := e.TriageLocker(time.Minute)
	in := e.inspector(locker, 0)
	c10s := e.Topology.Stream("rebase", "c10s", false)
	id, err := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: c10s, Values: map[string]any{"payload": "{}"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ agent, issue, msg string }{{"rebase", "RHEL-1", id}, {"triage", "RHEL-2", "9-0"}} {
		le, err := locker.Acquire(ctx, l.agent, l.issue, lease.AcquireOptions{Owner: "w", MessageID: l.msg})
		if err != nil {
			t.Fatal(err)
		}
		defer le.Release(ctx)
	}
	run, err := in.Running(ctx)
	if err != nil || len(run) != 2 {
		t.Fatalf("Running = %+v, %v", run, err)
	}
	if run[0].Lease.Issue != "RHEL-1" || run[0].Stream != c10s || run[0].Branch != "c10s" {
		t.Fatalf("rebase lease: %+v", run[0])
	}
	if run[1].Lease.Issue != "RHEL-2" || run[1].Stream != "" {
		t.Fatalf("a lease whose entry is in no stream: %+v", run[1])
	}
}

func TestNewestDeadLettersAndDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 0)
	var ids []string
	for i := range 5 {
		id, err := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Dead(), Values: map[string]any{"dead_error": fmt.Sprint("e", i)}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	newest, n, err := in.NewestDeadLetters(ctx, 2)
	if err != nil || n != 5 || len(newest) != 2 || newest[0].ID != ids[4] || newest[1].ID != ids[3] {
		t.Fatalf("NewestDeadLetters(2) = %+v, %d, %v", newest, n, err)
	}
	if got, err := in.Delete(asOperator(ctx), ids[1], ids[3], "1-1"); err != nil || got != 2 {
		t.Fatalf("Delete = %d, %v", got, err)
	}
	left, _ := in.DeadLetters(ctx, inspect.DeadFilter{})
	if len(left) != 3 || left[0].ID != ids[0] || left[1].ID != ids[2] || left[2].ID != ids[4] {
		t.Fatalf("left after Delete: %+v", left)
	}
	if _, err := in.Delete(asOperator(ctx), "nope"); err == nil {
		t.Fatal("Delete of a malformed id")
	}
}

// TestTwinEntryOfTheGuardedIDIsAnotherEvent: an agent's stream and its :todo twin
// repeat entry ids. The lease names its entry's stream, so the views name the guarded
// entry, not the other stream's entry of its id: Running gives the lease's stream, and
// Pending shows that entry guarded and the other one held for another entry.
func TestTwinEntryOfTheGuardedIDIsAnotherEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	locker := e.TriageLocker(time.Minute)
	in := e.inspector(locker, 0)
	main, todo := e.TriageStream(), e.Topology.Stream("triage", "", true)
	id := e.PublishTriage("RHEL-1")
	xs, err := e.Client.XRange(ctx, main, id, id).Result()
	if err != nil || len(xs) != 1 {
		t.Fatalf("the entry: %v %v", xs, err)
	}
	if err := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: todo, ID: id, Values: xs[0].Values}).Err(); err != nil {
		t.Fatal(err)
	}
	e.readAs(main, "triage", "w1", 1)
	e.readAs(todo, "triage", "w1", 1)
	le, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w1", MessageID: id, Stream: todo})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)

	run, err := in.Running(ctx)
	if err != nil || len(run) != 1 || run[0].Stream != todo || !run[0].Todo || run[0].Lease.Stream != todo {
		t.Fatalf("Running = %+v, %v; want the lease's entry in %s", run, err, todo)
	}
	groups, err := in.Pending(ctx, inspect.PendingFilter{Agent: "triage"})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, g := range groups {
		for _, x := range g.Entries {
			states[g.Stream] = x.State
		}
	}
	if states[todo] != inspect.StateGuarded || states[main] == inspect.StateGuarded {
		t.Fatalf("pending entries' states by stream: %v; want %s's guarded, %s's not", states, todo, main)
	}
}
