package lease_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// HandoffBatch ends two runs (their done records dated by when each ended, their
// entries acked) and, after their releases, takes four leases ahead: one of an ended
// run's issue whose entry entered before that run ended (superseded), one whose entry
// entered after (taken), one of a free issue (taken), one of an issue held by another
// token (locked).
func TestBatchEndsAndTakesAhead(t *testing.T) {
	t.Parallel() // own namespace; the times compared are the test's own
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	stream := ns + "triage"
	ids := pendingEntries(t, ctx, rdb, stream, 2)
	run1 := batchLease(t, l, "RHEL-1", ids[0])
	run2 := batchLease(t, l, "RHEL-2", ids[1])
	holder := mustAcquire(t, l, "triage", "RHEL-3")
	ended := time.Now().Add(-500 * time.Millisecond)
	next := func(issue, id string, entered time.Duration) lease.Next {
		return lease.Next{Agent: "triage", Key: issue, Options: lease.AcquireOptions{MessageID: id, EntryTime: ended.Add(entered)}}
	}
	ends := []lease.End{
		{Lease: run1, Entry: lease.Entry{Stream: stream, Group: "g", ID: ids[0]}, EndedAt: ended},
		{Lease: run2, Entry: lease.Entry{Stream: stream, Group: "g", ID: ids[1]}, EndedAt: ended},
	}
	sent := time.Now()
	ps, err := l.HandoffBatch(ctx, ends, []lease.Next{
		next("RHEL-1", "1-1", -300*time.Millisecond), next("RHEL-2", "1-2", 300*time.Millisecond),
		next("RHEL-4", "1-4", 0), next("RHEL-3", "1-3", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	var sup *lease.SupersededError
	if _, err := ps[0].Take(ctx); !errors.As(err, &sup) || sup.ByMessageID != ids[0] {
		t.Errorf("next of RHEL-1 that entered before its run ended: %v, want superseded by %s", err, ids[0])
	}
	for _, p := range ps[1:3] {
		le, err := p.Take(ctx)
		if err != nil {
			t.Fatalf("next %s: %v, want its lease", p.MessageID(), err)
		}
		t.Cleanup(func() { _, _ = le.Release(context.Background()) })
		if err := le.Check(ctx); err != nil {
			t.Errorf("next %s: its lease does not hold its key: %v", p.MessageID(), err)
		}
	}
	var locked *lease.LockedError
	if _, err := ps[3].Take(ctx); !errors.As(err, &locked) || locked.Holder.Fence != holder.Fence() {
		t.Errorf("next of RHEL-3, held by another token: %v, want locked by fence %d", err, holder.Fence())
	}
	for i, e := range ends {
		requireBatchEnded(t, ctx, rdb, e, ids[i], ended, time.Since(sent))
	}
}

// A run that ended long before its batch is dated at most a second back (maxBatchAgo):
// the worker's clock reading is trusted that far, no further.
func TestBatchDatesAtMostASecondBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	stream := ns + "triage"
	ids := pendingEntries(t, ctx, rdb, stream, 1)
	e := lease.End{Lease: batchLease(t, l, "RHEL-1", ids[0]), Entry: lease.Entry{Stream: stream, Group: "g", ID: ids[0]},
		EndedAt: time.Now().Add(-5 * time.Second)}
	sent := time.Now()
	if _, err := l.HandoffBatch(ctx, []lease.End{e}, nil); err != nil {
		t.Fatal(err)
	}
	requireBatchEnded(t, ctx, rdb, e, ids[0], sent.Add(-time.Second), time.Since(sent))
}

// A lease that cannot end in a batch (it drains) is refused, and nothing is sent.
func TestBatchRefusesDrainingLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "1-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = le.Release(context.Background()) })
	if le.Batchable() {
		t.Fatal("a draining lease is Batchable")
	}
	_, err = l.HandoffBatch(ctx, []lease.End{{Lease: le, Entry: lease.Entry{Stream: ns + "s", Group: "g", ID: "1-1"}, EndedAt: time.Now()}},
		[]lease.Next{{Agent: "triage", Key: "RHEL-2", Options: lease.AcquireOptions{MessageID: "1-2"}}})
	if err == nil {
		t.Fatal("HandoffBatch ended a draining lease")
	}
	if err := le.Check(ctx); err != nil {
		t.Errorf("the refused lease is no longer held: %v", err)
	}
	if exists(t, rdb, l.LockKey("triage", "RHEL-2")) {
		t.Error("the refused batch took its next's lease")
	}
}

// pendingEntries adds n entries to stream and reads them into group g: pending, to ack.
func pendingEntries(t *testing.T, ctx context.Context, rdb *redis.Client, stream string, n int) []string {
	t.Helper()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": i}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}, Block: -1}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != n {
		t.Fatalf("read %d entries: %v %v", n, res, err)
	}
	ids := make([]string, n)
	for i, m := range res[0].Messages {
		ids[i] = m.ID
	}
	return ids
}

func batchLease(t *testing.T, l *lease.Locker, issue, id string) *lease.Lease {
	t.Helper()
	le, err := l.Acquire(context.Background(), "triage", issue, lease.AcquireOptions{MessageID: id})
	if err != nil {
		t.Fatal(err)
	}
	if !le.Batchable() {
		t.Fatalf("a plain lease of %s is not Batchable", issue)
	}
	return le
}

// requireBatchEnded: e's key is free, its entry (id) acked, and its done record names id,
// dated by ended (no earlier, and no later than the batch's round trip took).
func requireBatchEnded(t *testing.T, ctx context.Context, rdb *redis.Client, e lease.End, id string, ended time.Time, took time.Duration) {
	t.Helper()
	keys := e.Lease.Keys()
	if get(t, rdb, keys.Lock) == e.Lease.Token() {
		t.Errorf("%s still held by its run after its batch", keys.Lock)
	}
	n, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.Entry.Stream, Group: "g", Start: id, End: id, Count: 1}).Result()
	if err != nil || len(n) != 0 {
		t.Errorf("entry %s not acked: %v %v", id, n, err)
	}
	f := strings.Fields(get(t, rdb, keys.Done))
	if len(f) < 2 || f[1] != id {
		t.Fatalf("done record of %s: %v, want it to name %s", keys.Lock, f, id)
	}
	ms, _ := strconv.ParseInt(f[0], 10, 64)
	if lo, hi := ended.UnixMilli()-2, ended.Add(took).UnixMilli()+2; ms < lo || ms > hi {
		t.Errorf("done record of %s dated %d, want by when its run ended, in [%d, %d]", keys.Lock, ms, lo, hi)
	}
}

// A batch with the pauses checks them for each lease it takes, in its script: checked
// when no pause exists and the entry never parked; not for an entry parked before,
// nor a lease not taken, nor a next without the pauses; none at all once a pause
// exists.
func TestBatchChecksPauses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	p := l.Pauses()
	stream := ns + "triage"
	holder := mustAcquire(t, l, "triage", "RHEL-3")
	t.Cleanup(func() { _, _ = holder.Release(context.Background()) })
	// 1-2 was parked once: its redelivery is a repeat, checked by its worker.
	rdb.HSet(ctx, p.Keys().Seen, stream+" 1-2", "w")
	next := func(issue, id string, pauses *lease.Pauses) lease.Next {
		return lease.Next{Agent: "triage", Key: issue, Options: lease.AcquireOptions{MessageID: id}, Pauses: pauses, Stream: stream}
	}
	batch := func(nexts ...lease.Next) []bool {
		t.Helper()
		ps, err := l.HandoffBatch(ctx, nil, nexts)
		if err != nil {
			t.Fatal(err)
		}
		var out []bool
		for _, pe := range ps {
			out = append(out, pe.PauseChecked())
			pe.GiveBack(ctx)
		}
		return out
	}
	got := batch(next("RHEL-1", "1-1", p), next("RHEL-2", "1-2", p), next("RHEL-3", "1-3", p), next("RHEL-4", "1-4", nil))
	if want := []bool{true, false, false, false}; !slices.Equal(got, want) {
		t.Fatalf("checked %v, want %v (free, parked before, held by another, without pauses)", got, want)
	}
	if _, err := p.Set(ctx, lease.Pause{Scope: "issue:RHEL-9", Reason: "test", By: "test"}); err != nil {
		t.Fatal(err)
	}
	if got := batch(next("RHEL-1", "1-5", p)); got[0] {
		t.Fatal("checked by the batch while a pause exists: its worker must check the pauses")
	}
}
