package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// TestHoldersOwnEntryIsNeitherQueuedNorDelivered: the entry a lease is held for comes
// back to another consumer while the lease lives (claimed after its worker was
// SIGKILLed, before the lease expired). Under coalesce and deliver it is busy like
// under drop, and nothing else: it is not appended to its own run's mailbox, not acked,
// not queued as the follow-up. Acked, it would never run again (its run died),
// and it would come back only as a follow-up of some later run of the issue, if any;
// queued, it would run twice. It stays pending, and runs again once the lease expires.
func TestHoldersOwnEntryIsNeitherQueuedNorDelivered(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	stream := ns + "rebuild"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": "x"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	holder, err := l.Acquire(ctx, "rebuild", "RHEL-1", lease.AcquireOptions{MessageID: id, Drain: true})
	if err != nil {
		t.Fatal(err)
	}

	_, err = l.Acquire(ctx, "rebuild", "RHEL-1", deliverOpts(stream, id, 10, "own"))
	var le *lease.LockedError
	if !errors.As(err, &le) || le.Delivered || le.MailboxID != "" || le.Holder.MessageID != id {
		t.Fatalf("deliver of the holder's own entry: %#v, want busy, neither delivered nor acked", err)
	}
	if n, _ := l.MailboxDepth(ctx, "rebuild", "RHEL-1"); n != 0 {
		t.Errorf("the holder's own entry is in its mailbox (depth %d)", n)
	}
	if pend, _ := rdb.XPending(ctx, stream, "g").Result(); pend.Count != 1 {
		t.Errorf("the holder's own entry was acked: pending %+v", pend)
	}

	_, err = l.Acquire(ctx, "rebuild", "RHEL-1", lease.AcquireOptions{MessageID: id, Drain: true,
		Queue: &lease.QueuedEvent{Stream: stream, Fields: map[string]any{"payload": "x"}}})
	if !errors.As(err, &le) || le.Queued || le.Holder.MessageID != id {
		t.Fatalf("coalesce of the holder's own entry: %#v, want busy, not queued", err)
	}
	if _, err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if holder.Requeued() != "" {
		t.Errorf("the release published the holder's own entry again as %s", holder.Requeued())
	}
	if n, _ := rdb.XLen(ctx, stream).Result(); n != 1 {
		t.Errorf("stream has %d entries, want the one", n)
	}
}

// TestTwinEntryOfTheHoldersIDIsAnotherEvent: a worker reads an agent's stream and its
// :todo twin, whose entry ids repeat. An entry of the twin with the id of the entry the
// holder runs is another event, and each policy treats it as one (dropped as busy,
// delivered, queued, waiting in line); only the holder's own entry (the same id in the
// same stream) is left alone (LockedError.Own). Told apart by id alone, the twin's
// event was left pending until a claim pass took it after MAX_IDLE_TIME, then ran
// where the policy would have dropped, delivered, queued or lined it up. A record that
// names no stream (a caller that does not know it) is still told by its id.
func TestTwinEntryOfTheHoldersIDIsAnotherEvent(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	bothFormats(t, func(t *testing.T, ctx context.Context, rdb *redis.Client, ns string, l *lease.Locker) {
		stream, twin, id := ns+"rebuild", ns+"rebuild:todo", "5-1"
		in := func(s string, ao lease.AcquireOptions) lease.AcquireOptions {
			ao.Stream = s
			return ao
		}
		busy := func(what string, ao lease.AcquireOptions) *lease.LockedError {
			t.Helper()
			_, err := l.Acquire(ctx, "rebuild", "RHEL-1", ao)
			var le *lease.LockedError
			if !errors.As(err, &le) {
				t.Fatalf("%s: %v, want the key busy", what, err)
			}
			if le.Holder.MessageID != id {
				t.Errorf("%s: the holder's message id reads %q, want %q", what, le.Holder.MessageID, id)
			}
			return le
		}
		if _, err := l.Acquire(ctx, "rebuild", "RHEL-1", lease.AcquireOptions{MessageID: id, Stream: stream}); err != nil {
			t.Fatal(err)
		}
		if le := busy("drop, the twin's entry", in(twin, lease.AcquireOptions{MessageID: id})); le.Own {
			t.Errorf("drop: the twin's entry %s was taken for the holder's own", id)
		}
		if le := busy("drop, the holder's entry", in(stream, lease.AcquireOptions{MessageID: id})); !le.Own {
			t.Errorf("drop: the holder's own entry was not told as its own")
		}
		if le := busy("drop, a caller that names no stream", lease.AcquireOptions{MessageID: id}); !le.Own {
			t.Errorf("drop: an entry named by its id alone was not told as the holder's own")
		}
		if le := busy("deliver, the twin's entry", in(twin, deliverOpts(twin, id, 10, "twin"))); le.Own || !le.Delivered {
			t.Errorf("deliver: the twin's entry: %+v, want it delivered", le)
		}
		if le := busy("deliver, the holder's entry", in(stream, deliverOpts(stream, id, 10, "own"))); !le.Own || le.Delivered {
			t.Errorf("deliver: the holder's own entry: %+v, want it left alone", le)
		}
		queue := func(s string) lease.AcquireOptions {
			return lease.AcquireOptions{MessageID: id, Stream: s, Drain: true,
				Queue: &lease.QueuedEvent{Stream: s, Fields: map[string]any{"payload": "x"}}}
		}
		if le := busy("coalesce, the holder's entry", queue(stream)); !le.Own || le.Queued {
			t.Errorf("coalesce: the holder's own entry: %+v, want it left alone", le)
		}
		if le := busy("coalesce, the twin's entry", queue(twin)); le.Own || !le.Queued {
			t.Errorf("coalesce: the twin's entry: %+v, want it queued", le)
		}
	})
}

// TestTwinEntryOfTheHoldersIDWaits: under the wait policy, the twin's entry with the
// holder's entry id joins the line; the holder's own entry does not.
func TestTwinEntryOfTheHoldersIDWaits(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	bothFormats(t, func(t *testing.T, ctx context.Context, rdb *redis.Client, ns string, l *lease.Locker) {
		stream, twin, id := ns+"rebase", ns+"rebase:todo", "5-1"
		for _, s := range []string{stream, twin} {
			if err := rdb.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
		}
		opts := func(s string) lease.AcquireOptions {
			ao := waitOpts(s, id, id, 10)
			ao.Stream = s
			return ao
		}
		if _, err := l.Acquire(ctx, "rebase", "RHEL-1", opts(stream)); err != nil {
			t.Fatal(err)
		}
		var le *lease.LockedError
		if _, err := l.Acquire(ctx, "rebase", "RHEL-1", opts(stream)); !errors.As(err, &le) || !le.Own || le.Waited {
			t.Errorf("the holder's own entry: %v (%+v), want it left alone", err, le)
		}
		if _, err := l.Acquire(ctx, "rebase", "RHEL-1", opts(twin)); !errors.As(err, &le) || le.Own || !le.Waited || le.Position != 1 {
			t.Errorf("the twin's entry: %v (%+v), want it waiting at 1", err, le)
		}
	})
}

// TestTwinEntryOfALeaseTakenAheadIsAnotherEvent: a lease taken ahead for an entry (a
// batch's next) names its stream as an acquire's does.
func TestTwinEntryOfALeaseTakenAheadIsAnotherEvent(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	stream, twin, id := ns+"rebuild", ns+"rebuild:todo", "5-1"
	ps, err := l.HandoffBatch(ctx, nil, []lease.Next{{Agent: "rebuild", Key: "RHEL-1",
		Options: lease.AcquireOptions{MessageID: id, Stream: stream}}})
	if err != nil || len(ps) != 1 || ps[0].Err() != nil {
		t.Fatalf("lease taken ahead: %v %v", ps, err)
	}
	var le *lease.LockedError
	if _, err := l.Acquire(ctx, "rebuild", "RHEL-1", lease.AcquireOptions{MessageID: id, Stream: twin}); !errors.As(err, &le) || le.Own {
		t.Errorf("the twin's entry: %v (%+v), want busy, not the holder's own", err, le)
	}
	if _, err := l.Acquire(ctx, "rebuild", "RHEL-1", lease.AcquireOptions{MessageID: id, Stream: stream}); !errors.As(err, &le) || !le.Own {
		t.Errorf("the entry it was taken for: %v (%+v), want the holder's own", err, le)
	}
}

// TestTwinEntryOfTheReleasedIDIsSuperseded: an event that entered its stream while
// another event's run held the issue counts as superseded once that run is released
// (the drop policy's check), whatever its id: an entry of the :todo twin with the
// released entry's id entered during that run and is another event. Only the released
// entry itself, retried, is exempt (its run may have failed); a caller that names no
// stream is told by id alone.
func TestTwinEntryOfTheReleasedIDIsSuperseded(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	bothFormats(t, func(t *testing.T, ctx context.Context, rdb *redis.Client, ns string, l *lease.Locker) {
		stream, twin, id := ns+"rebuild", ns+"rebuild:todo", "5-1"
		opts := func(s string) lease.AcquireOptions {
			return lease.AcquireOptions{MessageID: id, Stream: s, EntryTime: time.UnixMilli(5)}
		}
		le, err := l.Acquire(ctx, "rebuild", "RHEL-1", opts(stream))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var sup *lease.SupersededError
		if _, err := l.Acquire(ctx, "rebuild", "RHEL-1", opts(twin)); !errors.As(err, &sup) || sup.ByMessageID != id {
			t.Fatalf("the twin's entry %s: %v, want it superseded by the released run of %s", id, err, id)
		}
		for _, ao := range []lease.AcquireOptions{opts(stream), {MessageID: id, EntryTime: time.UnixMilli(5)}} {
			again, err := l.Acquire(ctx, "rebuild", "RHEL-1", ao)
			if err != nil {
				t.Fatalf("the released entry again (stream %q): %v, want the lease", ao.Stream, err)
			}
			if _, err := again.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// bothFormats runs f on a locker of each key format, each in its own namespace.
func bothFormats(t *testing.T, f func(t *testing.T, ctx context.Context, rdb *redis.Client, ns string, l *lease.Locker)) {
	for _, format := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		t.Run(formatName(format), func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			f(t, context.Background(), rdb, ns, newLocker(t, rdb, ns, lease.Options{Format: format}))
		})
	}
}

// TestInfoGuardsItsEntryInItsStream: a lease guards its entry's id in the stream its
// record names, and that id in any stream when it names none (a record written before
// records named streams).
func TestInfoGuardsItsEntryInItsStream(t *testing.T) {
	named, plain := lease.Info{MessageID: "5-1", Stream: "s"}, lease.Info{MessageID: "5-1"}
	for _, c := range []struct {
		info       lease.Info
		stream, id string
		want       bool
	}{{named, "s", "5-1", true}, {named, "s:todo", "5-1", false}, {named, "s", "5-2", false},
		{plain, "s:todo", "5-1", true}, {plain, "s", "5-2", false}} {
		if got := c.info.Guards(c.stream, c.id); got != c.want {
			t.Errorf("%+v.Guards(%q, %q) = %v, want %v", c.info, c.stream, c.id, got, c.want)
		}
	}
}
