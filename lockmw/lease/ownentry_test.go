package lease_test

import (
	"context"
	"errors"
	"testing"

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
