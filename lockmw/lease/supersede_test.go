package lease_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func supersedeAcquire(t *testing.T, l *lease.Locker, id string) (*lease.Lease, error) {
	t.Helper()
	le, err := l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: id, Supersede: true})
	if le != nil {
		t.Cleanup(func() { _, _ = le.Release(context.Background()) })
	}
	return le, err
}

// watch starts l's eviction watch and waits until it listens.
func watch(t *testing.T, rdb redis.UniversalClient, l *lease.Locker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = l.WatchEvictions(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	redistest.Eventually(t, 5*time.Second, func() bool {
		return rdb.PubSubNumSub(ctx, l.EvictionChannel()).Val()[l.EvictionChannel()] >= 1
	}, "the locker subscribed to %s", l.EvictionChannel())
}

// A newer event's supersede acquire takes the lease over at once with a higher fence:
// the old lease ends with a *SupersededByError (ErrSuperseded and ErrLeaseLost) naming
// the newer entry, its fenced append is refused, and the new lease waits until the old
// run has stopped (released). An older event does not supersede a newer holder, and the
// holder's own entry does not supersede itself.
func TestSupersedeTakesOverAndWaitsForTheOldRun(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	old := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Owner: "w1"})
	watch(t, rdb, old)
	newer := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Owner: "w2"})

	e1, err := supersedeAcquire(t, old, "1000-0")
	if err != nil || e1.Supersedes() != "" {
		t.Fatalf("first acquire: %v (supersedes %q)", err, e1.Supersedes())
	}
	if err := e1.WaitStopped(); err != nil {
		t.Fatalf("nothing to wait for: %v", err)
	}
	olderOrOwnEntryIsBusy(t, newer, e1)
	e2 := supersedeEndsTheOldLease(t, ctx, ns, newer, e1)
	newRunWaitsForTheOld(t, ctx, e1, e2)
}

// olderOrOwnEntryIsBusy: an older event, and a copy of the holder e1's own entry (1000-0),
// acquired on newer are busy; they supersede nothing.
func olderOrOwnEntryIsBusy(t *testing.T, newer *lease.Locker, e1 *lease.Lease) {
	t.Helper()
	// An older event, and a copy of the holder's own entry, are busy: they supersede nothing.
	_, err := supersedeAcquire(t, newer, "999-5")
	var locked *lease.LockedError
	if !errors.As(err, &locked) || !locked.Newer || locked.Holder.MessageID != "1000-0" {
		t.Fatalf("older event: %v (%+v), want busy with a newer holder", err, locked)
	}
	_, err = supersedeAcquire(t, newer, "1000-0")
	if !errors.As(err, &locked) || locked.Newer {
		t.Fatalf("the holder's own entry: %v, want busy, not newer", err)
	}
	if e1.Err() != nil {
		t.Fatalf("the holder was ended by an event that did not supersede it: %v", e1.Err())
	}
}

// supersedeEndsTheOldLease takes e1's lease over on newer with entry 1000-1: a higher
// fence, the operator view says so, and e1 ends with a SupersededByError, its fenced
// writes refused. It returns the new lease.
func supersedeEndsTheOldLease(t *testing.T, ctx context.Context, ns string, newer *lease.Locker, e1 *lease.Lease) *lease.Lease {
	t.Helper()
	start := time.Now()
	e2, err := supersedeAcquire(t, newer, "1000-1")
	if err != nil {
		t.Fatal(err)
	}
	if e2.Fence() <= e1.Fence() || e2.Supersedes() != "1000-0" {
		t.Fatalf("new lease fence %d (old %d), supersedes %q", e2.Fence(), e1.Fence(), e2.Supersedes())
	}
	if info, ok, err := newer.Inspect(ctx, "rebase", "RHEL-1"); err != nil || !ok || info.Supersedes != "1000-0" || info.MessageID != "1000-1" {
		t.Fatalf("operator view %+v (%v, %v), want 1000-1 superseding 1000-0", info, ok, err)
	}
	redistest.Eventually(t, time.Second, func() bool { return e1.Err() != nil }, "the old lease ends at the announcement")
	t.Logf("old lease ended %s after the take-over", time.Since(start).Round(time.Millisecond))
	var by *lease.SupersededByError
	if cause := e1.Err(); !errors.Is(cause, lease.ErrSuperseded) || !errors.Is(cause, lease.ErrLeaseLost) ||
		!errors.As(cause, &by) || by.ByMessageID != "1000-1" || by.Fence != e2.Fence() {
		t.Fatalf("old lease's cause %v, want a SupersededByError naming 1000-1 at fence %d", cause, e2.Fence())
	}
	if _, err := e1.XAdd(ctx, ns+"out", 0, map[string]any{"late": "write"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("the superseded run's late append: %v, want refused", err)
	}
	if err := e1.Check(ctx); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("the superseded run's check: %v, want ErrLeaseLost", err)
	}
	return e2
}

// newRunWaitsForTheOld: e2's WaitStopped returns only once e1 (superseded) releases, and
// that release deletes nothing.
func newRunWaitsForTheOld(t *testing.T, ctx context.Context, e1, e2 *lease.Lease) {
	t.Helper()
	// The new run waits for the old one to stop.
	waited := make(chan error, 1)
	go func() { waited <- e2.WaitStopped() }()
	select {
	case err := <-waited:
		t.Fatalf("the new run started before the old one stopped (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	stoppedAt := time.Now()
	if deleted, err := e1.Release(ctx); err != nil || deleted {
		t.Fatalf("old release: deleted %v, %v; want nothing deleted (the key is the new holder's)", deleted, err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("new run started %s after the old one stopped", time.Since(stoppedAt).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the new run did not start after the old one stopped")
	}
	if err := e2.Check(ctx); err != nil {
		t.Fatalf("new lease: %v", err)
	}
}

// Three events in a row: the middle one, superseded while it waits for the first to
// stop, ends with a SupersededByError naming the third; the third waits for both.
func TestSupersedeTwiceInARow(t *testing.T) {
	t.Parallel()
	for name, format := range map[string]lease.KeyFormat{"compat": lease.KeysCompat, "cluster keys": lease.KeysCluster} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			supersedeTwice(t, format)
		})
	}
}

func supersedeTwice(t *testing.T, format lease.KeyFormat) {
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Format: format})
	watch(t, rdb, l)
	e1, _ := supersedeAcquire(t, l, "1-0")
	e2, err := supersedeAcquire(t, l, "2-0")
	if err != nil {
		t.Fatal(err)
	}
	e3, err := supersedeAcquire(t, l, "3-0")
	if err != nil {
		t.Fatal(err)
	}
	if e1.Fence() >= e2.Fence() || e2.Fence() >= e3.Fence() {
		t.Fatalf("fences %d %d %d, want increasing", e1.Fence(), e2.Fence(), e3.Fence())
	}
	var by *lease.SupersededByError
	if err := e2.WaitStopped(); !errors.As(err, &by) || by.ByMessageID != "3-0" {
		t.Fatalf("the middle run's wait: %v, want superseded by 3-0", err)
	}
	redistest.Eventually(t, time.Second, func() bool { return e1.Err() != nil }, "the first lease ends")
	waited := make(chan error, 1)
	go func() { waited <- e3.WaitStopped() }()
	_, _ = e2.Release(context.Background())
	select {
	case err := <-waited:
		t.Fatalf("the newest run started while the first still ran (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	_, _ = e1.Release(context.Background())
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the newest run did not start once both had stopped")
	}
}

// A superseded holder whose process is dead never says it stopped: the new run waits
// until the old key would have expired, then starts. A holder that missed the
// announcement (not watching) ends at its next heartbeat with the typed cause.
func TestSupersedeOfADeadOrDeafHolder(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	deaf := newLocker(t, rdb, ns, lease.Options{TTL: 900 * time.Millisecond}) // no WatchEvictions
	l := newLocker(t, rdb, ns, lease.Options{TTL: 900 * time.Millisecond})
	e1, _ := supersedeAcquire(t, deaf, "1-0")
	start := time.Now()
	e2, err := supersedeAcquire(t, l, "2-0")
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 2*time.Second, func() bool { return e1.Err() != nil }, "the deaf holder's heartbeat ends its lease")
	if cause := e1.Err(); !errors.Is(cause, lease.ErrSuperseded) || !errors.Is(cause, lease.ErrLeaseLost) {
		t.Fatalf("deaf holder's cause %v, want superseded", cause)
	}
	// e1 never releases (a dead process): e2 waits for the old key's expiry (TTL).
	if err := e2.WaitStopped(); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 600*time.Millisecond || waited > 3*time.Second {
		t.Fatalf("the new run waited %s for a dead holder, want about its TTL (900ms)", waited)
	}
	if err := e2.Check(context.Background()); err != nil {
		t.Fatalf("the new lease: %v", err)
	}
}

// The supersede acquire is safe to repeat (a reply lost, the script sent again): the
// repeat returns the same lease and fence and supersedes nothing more.
func TestSupersedeRepeatIsTheSameTakeOver(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second})
	e1, _ := supersedeAcquire(t, l, "1-0")
	e2, err := supersedeAcquire(t, l, "2-0")
	if err != nil {
		t.Fatal(err)
	}
	k := l.Keys("rebase", "RHEL-1")
	// The script again, with e2's token, as go-redis would send it.
	src := xonce.IndexLua + mustRead(t, "scripts/lease.lua") + mustRead(t, "scripts/acquire_or_supersede.lua")
	res, err := rdb.Eval(context.Background(), src, []string{k.Lock, k.Info, k.Fence, k.Done, k.Stop},
		e2.Token(), 30000, "x", time.Now().UnixMilli(), "2-0", "").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if res[0].(int64) != 1 || res[1].(int64) != e2.Fence() || res[2].(int64) != 1 || res[3] != "1-0" || res[4].(int64) != 0 {
		t.Fatalf("repeat reply %v, want {1, %d, 1, 1-0, 0}", res, e2.Fence())
	}
	if n := rdb.HLen(context.Background(), k.Stop).Val(); n != 1 {
		t.Fatalf("stop hash holds %d runs, want 1", n)
	}
	_, _ = e1.Release(context.Background())
	if err := e2.WaitStopped(); err != nil {
		t.Fatal(err)
	}
}

// Supersede is refused with options it cannot honour.
func TestSupersedeOptions(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	for name, ao := range map[string]lease.AcquireOptions{
		"no message id": {Supersede: true},
		"queue":         {Supersede: true, MessageID: "1-0", Queue: &lease.QueuedEvent{Stream: "s"}},
	} {
		if _, err := l.Acquire(context.Background(), "rebase", "RHEL-1", ao); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Under supersede, what counts is the order of events, not of times: an event that
// waited while an older event's run went on runs after it (it is the newest); one
// older than the last released run is refused as superseded by it.
func TestSupersedeByOrderOfEvents(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second})
	ctx := context.Background()
	acq := func(id string, entered time.Time) (*lease.Lease, error) {
		return l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: id, Supersede: true, EntryTime: entered})
	}
	e1, err := acq("1000-0", time.UnixMilli(1000))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = e1.Release(ctx) // released now, long after 2000-0 entered
	e2, err := acq("2000-0", time.UnixMilli(2000))
	if err != nil {
		t.Fatalf("an event newer than the released run: %v, want it to run", err)
	}
	_, _ = e2.Release(ctx)
	var sup *lease.SupersededError
	if _, err := acq("1500-0", time.UnixMilli(1500)); !errors.As(err, &sup) || sup.ByMessageID != "2000-0" {
		t.Fatalf("an event older than the released run: %v, want superseded by 2000-0", err)
	}
}

// A take-over announced while the old holder's Locker was not subscribed yet (its
// watch starts beside the first events, and a loaded machine runs it late; or it was
// reconnecting) ends the old lease as soon as the watch subscribes, not at its next
// heartbeat (TTL/3, ten seconds here): the watch checks every live lease's key on each
// (re)subscription (pipeline TestSupersedeCancelsTheRunningEvent failed "not
// cancelled within 5s" this way under load).
func TestTakeOverAnnouncedBeforeTheWatchEndsTheLeaseOnSubscribe(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	old := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Owner: "w1"})
	newer := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Owner: "w2"})
	e1, err := supersedeAcquire(t, old, "1000-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := supersedeAcquire(t, newer, "1000-1"); err != nil {
		t.Fatal(err)
	}
	if e1.Err() != nil {
		t.Fatalf("ended before anyone watched: %v", e1.Err())
	}
	watch(t, rdb, old)
	redistest.Eventually(t, 5*time.Second, func() bool { return e1.Err() != nil }, "the old lease ends once the watch subscribed")
	var by *lease.SupersededByError
	if !errors.As(e1.Err(), &by) || by.ByMessageID != "1000-1" {
		t.Fatalf("cause %v, want a SupersededByError naming 1000-1", e1.Err())
	}
}

// A take-over given back before the run it superseded stopped leaves the key free while
// that run still winds down. Whatever takes the free key next (any policy's acquire, a
// lease taken ahead), on whatever worker, and whatever that worker's rules, waits for
// that run: its WaitStopped returns only once the old run has released. The stop hash
// is the key's own state; it was once read only by workers with a supersede rule
// (AcquireOptions.Stopping), so a worker without one ran its event beside the stopping
// run (the model checker found the overlap for the first: TestModelLeaseBatch, seed 195
// of 200; a mixed deployment, as in a rolling change of ON_CONFLICT, left the second).
func TestGivenBackTakeOverLeavesTheOldRunToStop(t *testing.T) {
	t.Parallel()
	takers := map[string]func(*testing.T, *lease.Locker, string) (*lease.Lease, error){
		"plain": func(t *testing.T, l *lease.Locker, _ string) (*lease.Lease, error) {
			return l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1000-3"})
		},
		"coalesce": func(t *testing.T, l *lease.Locker, ns string) (*lease.Lease, error) {
			return l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1000-3",
				Queue: &lease.QueuedEvent{Stream: ns + "rebase", Fields: map[string]any{"id": "1000-3"}}})
		},
		"deliver": func(t *testing.T, l *lease.Locker, ns string) (*lease.Lease, error) {
			return l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1000-3",
				Deliver: &lease.DeliverOptions{Followup: map[string]any{"id": "1000-3"},
					Event: lease.QueuedEvent{Stream: ns + "rebase", Fields: map[string]any{"id": "1000-3"}}}})
		},
		"issue scope": func(t *testing.T, l *lease.Locker, _ string) (*lease.Lease, error) {
			return l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1000-3",
				Shared: []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-1"}}})
		},
		"wait": func(t *testing.T, l *lease.Locker, ns string) (*lease.Lease, error) {
			return l.Acquire(context.Background(), "rebase", "RHEL-1", waitOpts(ns+"rebase", "1000-3", "1000-3", 0))
		},
		"wait, issue scope": func(t *testing.T, l *lease.Locker, ns string) (*lease.Lease, error) {
			o := waitOpts(ns+"rebase", "1000-3", "1000-3", 0)
			o.Shared = []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-1"}}
			return l.Acquire(context.Background(), "rebase", "RHEL-1", o)
		},
		"taken ahead in a batch": func(t *testing.T, l *lease.Locker, _ string) (*lease.Lease, error) {
			ps, err := l.HandoffBatch(context.Background(), nil, []lease.Next{{Agent: "rebase", Key: "RHEL-1",
				Options: lease.AcquireOptions{MessageID: "1000-3"}}})
			if err != nil {
				return nil, err
			}
			return ps[0].Take(context.Background())
		},
		"taken ahead by a hand-off": func(t *testing.T, l *lease.Locker, ns string) (*lease.Lease, error) {
			ctx := context.Background()
			other, err := l.Acquire(ctx, "rebase", "RHEL-2", lease.AcquireOptions{MessageID: "1000-2"})
			if err != nil {
				return nil, err
			}
			p, err := other.Handoff(ctx, lease.Entry{Stream: ns + "rebase", Group: "g", ID: "1000-2"},
				&lease.Next{Agent: "rebase", Key: "RHEL-1", Options: lease.AcquireOptions{MessageID: "1000-3"}})
			if err != nil {
				return nil, err
			}
			return p.Take(ctx)
		},
	}
	for name, take := range takers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, old, ns := givenBackTakeOver(t)
			le, err := take(t, l, ns)
			if err != nil {
				t.Fatalf("taking the free key: %v", err)
			}
			t.Cleanup(func() { _, _ = le.Release(context.Background()) })
			newRunWaitsForTheOld(t, context.Background(), old, le)
		})
	}
}

// givenBackTakeOver: on a Locker of its own namespace, a run of RHEL-1 (entry 1000-0)
// is taken over by a newer event's, whose lease is then given back before the old run
// stopped. It returns the Locker, the old run's lease (still stopping) and the namespace.
func givenBackTakeOver(t *testing.T) (*lease.Locker, *lease.Lease, string) {
	t.Helper()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second})
	old, err := supersedeAcquire(t, l, "1000-0")
	if err != nil {
		t.Fatal(err)
	}
	taker, err := supersedeAcquire(t, l, "1000-1")
	if err != nil || taker.Supersedes() != "1000-0" {
		t.Fatalf("take-over: %v", err)
	}
	if err := taker.GiveBack(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l, old, ns
}
