package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// slotReq is the take of entry id (lid: the event's first entry) of component fair.
func slotReq(stream, id, lid, fair string, prio bool) lease.SlotRequest {
	return lease.SlotRequest{Limits: []lease.Limit{{Key: "agent:rebase", N: 1}}, LineID: lid, Issue: "RHEL-1",
		Priority: prio, Fair: fair, Weight: 1,
		Event: lease.QueuedEvent{Stream: stream, Fields: map[string]any{"slot_from": lid, "fair": fair}},
		Ack:   &lease.Entry{Stream: stream, Group: "g", ID: id}}
}

// TestSlotsHandOnInFairOrder: under a limit of 1, a flood of component A waits, then B
// and a priority event; each free hands the slot to the next in line (the priority
// one first, then A and B in turns), appending its copy, whose take gets the slot.
func TestSlotsHandOnInFairOrder(t *testing.T) {
	for _, format := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		rdb, ns := redistest.Client(t)
		ctx := context.Background()
		l := newLocker(t, rdb, ns, lease.Options{Format: format, TTL: 5 * time.Second})
		stream := ns + "s"
		if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
			t.Fatal(err)
		}
		held, err := l.TakeSlots(ctx, slotReq(stream, "1-1", "1-1", "A", false))
		if err != nil {
			t.Fatal(err)
		}
		waiters := []struct {
			lid, fair string
			prio      bool
		}{{"2-1", "A", false}, {"2-2", "A", false}, {"2-3", "A", false}, {"3-1", "B", false}, {"3-2", "B", false}, {"4-1", "C", true}}
		for i, w := range waiters {
			_, err := l.TakeSlots(ctx, slotReq(stream, w.lid, w.lid, w.fair, w.prio))
			var we *lease.SlotsWaitingError
			if !errors.As(err, &we) || we.Used != 1 || we.Waiting != int64(i+1) {
				t.Fatalf("%s: %v, want it waiting behind %d", w.lid, err, i)
			}
		}
		u, err := l.SlotUsage(ctx, "agent:rebase")
		if err != nil || u.Used != 1 || u.Limit != 1 || u.Waiting != 6 || u.Priority != 1 {
			t.Fatalf("usage %+v, %v", u, err)
		}
		var order []string
		for range waiters {
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			msgs := readCopies(t, rdb, stream)
			if len(msgs) != 1 {
				t.Fatalf("%d copies appended by one free, want 1", len(msgs))
			}
			lid := msgs[0].Values["slot_from"].(string)
			order = append(order, lid)
			if held, err = l.TakeSlots(ctx, slotReq(stream, msgs[0].ID, lid, msgs[0].Values["fair"].(string), false)); err != nil {
				t.Fatalf("the copy of %s: %v", lid, err)
			}
		}
		want := []string{"4-1", "2-1", "3-1", "2-2", "3-2", "2-3"}
		if !equal(order, want) {
			t.Fatalf("format %d: handed in order %v, want %v (priority first, then A and B in turns)", format, order, want)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func readCopies(t *testing.T, rdb *redis.Client, stream string) []redis.XMessage {
	t.Helper()
	res, err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "g", Consumer: "c",
		Streams: []string{stream, ">"}, Block: -1}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if len(res) == 0 {
		return nil
	}
	return res[0].Messages
}

// TestSlotsTakenWithTheLease: on standalone Redis a run's slot and its lease are one
// acquire. Under a limit of 1: the first run holds both; a second issue's event finds
// the slot full and waits (acked), holding no lease; an event of the first issue finds
// the lease busy and is only told so (no slot, not in the slot's line); the first run's
// release frees its slot in the same script and hands it on, and the copy's acquire
// takes the slot and its lease. A supersede acquire that finds the slot full waits too.
// On Redis Cluster the option is refused (TakeSlots there).
func TestSlotsTakenWithTheLease(t *testing.T) {
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second})
	stream := ns + "s"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	opts := func(id, lid string) lease.AcquireOptions {
		req := slotReq(stream, id, lid, "A", false)
		return lease.AcquireOptions{MessageID: id, Slots: &req}
	}
	first, err := l.Acquire(ctx, "rebase", "RHEL-1", opts("1-1", "1-1"))
	if err != nil || len(first.Slots()) != 1 {
		t.Fatalf("first: %v, slots %v", err, first)
	}
	_, err = l.Acquire(ctx, "rebase", "RHEL-2", opts("2-1", "2-1"))
	var w *lease.SlotsWaitingError
	if !errors.As(err, &w) || !w.Acked || w.Used != 1 || w.Position != 1 {
		t.Fatalf("second issue: %v, want it waiting for the slot, acked", err)
	}
	if n, _ := rdb.Exists(ctx, l.Keys("rebase", "RHEL-2").Lock).Result(); n != 0 {
		t.Fatal("an event that waits for a slot holds its issue's lease")
	}
	_, err = l.Acquire(ctx, "rebase", "RHEL-1", opts("3-1", "3-1"))
	if !errors.Is(err, lease.ErrLocked) || errors.As(err, &w) {
		t.Fatalf("busy issue: %v, want the lease's busy error, not a wait for a slot", err)
	}
	coalesce := opts("3-2", "3-2")
	coalesce.Queue = &lease.QueuedEvent{Stream: stream, Fields: map[string]any{"n": "3-2"}}
	var locked *lease.LockedError
	if _, err = l.Acquire(ctx, "rebase", "RHEL-1", coalesce); !errors.As(err, &locked) || !locked.Queued {
		t.Fatalf("busy issue, coalesce: %v, want it queued behind the lease, not waiting for a slot", err)
	}
	if u, _ := l.SlotUsage(ctx, "agent:rebase"); u.Used != 1 || u.Waiting != 1 {
		t.Fatalf("usage %+v: want 1 used (the first run), 1 waiting", u)
	}
	wait := opts("3-3", "3-3")
	wait.Wait = &lease.WaitOptions{LineID: "3-3", Event: lease.QueuedEvent{Stream: stream}}
	if _, err := l.Acquire(ctx, "rebase", "RHEL-3", wait); !errors.As(err, &w) || w.Position != 2 {
		t.Fatalf("wait policy, free issue, slot full: %v, want it second in the slot's line", err)
	}
	if n, _ := rdb.Exists(ctx, l.Keys("rebase", "RHEL-3").Lock).Result(); n != 0 {
		t.Fatal("a wait-policy event that waits for a slot holds its issue's lease")
	}
	sup := opts("4-1", "4-1")
	sup.Supersede = true
	if _, err := l.Acquire(ctx, "rebase", "RHEL-1", sup); !errors.As(err, &w) {
		t.Fatalf("supersede with the slot full: %v, want it waiting for the slot (a take-over would hold a lease without one)", err)
	}
	if _, err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Appended: the coalesced follow-up (the lease's queue), then the slot's waiter's copy.
	msgs := readCopies(t, rdb, stream)
	if len(msgs) != 2 || msgs[0].Values["n"] != "3-2" || msgs[1].Values["slot_from"] != "2-1" {
		t.Fatalf("the release appended %v, want the follow-up, then the copy of 2-1 (the slot handed to it)", msgs)
	}
	next, err := l.Acquire(ctx, "rebase", "RHEL-2", opts(msgs[1].ID, "2-1"))
	if err != nil {
		t.Fatalf("the copy's acquire: %v", err)
	}
	if u, _ := l.SlotUsage(ctx, "agent:rebase"); u.Used != 1 || u.Waiting != 2 {
		t.Fatalf("usage %+v: want 1 used (the copy's run), 2 waiting (the wait-policy event, the supersede)", u)
	}
	if _, err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}

	crdb, cns := redistest.Client(t)
	cl := newLocker(t, crdb, cns, lease.Options{TTL: 5 * time.Second, Format: lease.KeysCluster})
	if _, err := cl.Acquire(ctx, "rebase", "RHEL-1", opts("1-1", "1-1")); err == nil || !strings.Contains(err.Error(), "standalone") {
		t.Fatalf("Cluster: %v, want the option refused", err)
	}
}

// Two events that entered an agent's stream and its :todo stream with one entry id wait
// for a full limit as two waiters, and each gets a slot in its turn. The lines named a
// waiter by its entry id alone: the second overwrote the first's record, both turns
// appended the second's copy, and the first event was never run.
func TestSlotsTellApartTwoStreamsEntriesOfOneID(t *testing.T) {
	for _, format := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		rdb, ns := redistest.Client(t)
		ctx := context.Background()
		l := newLocker(t, rdb, ns, lease.Options{Format: format, TTL: 5 * time.Second})
		streams := []string{ns + "s", ns + "s:todo"}
		for _, s := range streams {
			if err := rdb.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
		}
		held, err := l.TakeSlots(ctx, slotReq(streams[0], "1-1", "1-1", "A", false))
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range streams {
			_, err := l.TakeSlots(ctx, slotReq(s, "5-1", "5-1", "A", i == 1))
			var we *lease.SlotsWaitingError
			if !errors.As(err, &we) || we.Duplicate || we.Waiting != int64(i+1) {
				t.Fatalf("format %d: 5-1 of %s: %v (%+v), want a new waiter, %d waiting", format, s, err, we, i+1)
			}
		}
		// The priority lane's first: the :todo stream's event, then the other.
		for _, s := range []string{streams[1], streams[0]} {
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			msgs := readCopies(t, rdb, s)
			if len(msgs) != 1 || msgs[0].Values["slot_from"] != "5-1" {
				t.Fatalf("format %d: the copies appended to %s: %+v, want 5-1's", format, s, msgs)
			}
			if held, err = l.TakeSlots(ctx, slotReq(s, msgs[0].ID, "5-1", "A", false)); err != nil {
				t.Fatalf("format %d: the copy of 5-1 in %s: %v", format, s, err)
			}
		}
		if u, err := l.SlotUsage(ctx, "agent:rebase"); err != nil || u.Used != 1 || u.Waiting != 0 {
			t.Fatalf("format %d: usage %+v, %v: want the last copy's run alone", format, u, err)
		}
	}
}
