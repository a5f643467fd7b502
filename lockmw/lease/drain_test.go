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

// The release paths of these tests: a plain Release, and a Handoff (standalone: one
// script; Cluster: the release, then the ack) with and without the next entry's lease
// taken ahead for the same issue.
var releasePaths = []string{"release", "handoff", "handoff taking ahead"}

// releaseBy ends le by path and returns the lease taken ahead, if any.
func releaseBy(t *testing.T, le *lease.Lease, path, stream string) *lease.Pending {
	t.Helper()
	ctx := context.Background()
	e := lease.Entry{Stream: stream, Group: "g", ID: "99-0"}
	var p *lease.Pending
	var err error
	switch path {
	case "release":
		_, err = le.Release(ctx)
	case "handoff":
		p, err = le.Handoff(ctx, e, nil)
	default:
		p, err = le.Handoff(ctx, e, &lease.Next{Agent: le.Agent(), Key: le.Issue(), Options: lease.AcquireOptions{MessageID: "100-0"}})
	}
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if p != nil {
		t.Cleanup(func() { p.GiveBack(context.Background()) })
	}
	return p
}

// queueBehind queues the coalesce event id behind the holder of RHEL-1.
func queueBehind(t *testing.T, l *lease.Locker, stream, id string) {
	t.Helper()
	_, err := l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: id,
		Queue: &lease.QueuedEvent{Stream: stream, Fields: map[string]any{"id": id}}})
	var locked *lease.LockedError
	if !errors.As(err, &locked) || !locked.Queued {
		t.Fatalf("queue %s behind the holder: %v, want queued", id, err)
	}
}

// published checks that stream holds exactly one entry, the follow-up queued as id,
// and that the queue is gone.
func published(t *testing.T, rdb redis.UniversalClient, keys lease.Keys, stream, id string) {
	t.Helper()
	ctx := context.Background()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil || len(msgs) != 1 || msgs[0].Values["id"] != id {
		t.Fatalf("stream %s holds %v (%v), want the follow-up %s once: it was stranded", stream, msgs, err, id)
	}
	if n := rdb.Exists(ctx, keys.Queue).Val(); n != 0 {
		t.Fatalf("the queue %s is still there after its follow-up was published", keys.Queue)
	}
}

// A coalesce event queued behind a supersede holder (ON_CONFLICT *=supersede beside a
// coalesce rule: the take-over acquire does not drain) is published by that holder's
// release, on every release path and key format: whether a release drains is the
// key's own state (a queued follow-up exists), not the acquire's options. Issue 34,
// item 3.
func TestCoalescedBehindSupersedeHolderIsPublished(t *testing.T) {
	t.Parallel()
	for _, format := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		for _, path := range releasePaths {
			t.Run(formatName(format)+"/"+path, func(t *testing.T) {
				t.Parallel()
				rdb, ns := redistest.Client(t)
				l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Format: format})
				stream := ns + "s"
				s, err := l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "2-0", Supersede: true})
				if err != nil {
					t.Fatal(err)
				}
				queueBehind(t, l, stream, "3-0")
				p := releaseBy(t, s, path, stream)
				published(t, rdb, s.Keys(), stream, "3-0")
				if s.Requeued() == "" {
					t.Error("Requeued does not name the published follow-up")
				}
				// A lease taken ahead for the same issue is held, or not taken: never
				// refused as busy by the lease being released.
				if p != nil && p.Err() != nil {
					t.Errorf("lease taken ahead: %v", p.Err())
				}
			})
		}
	}
}

// A supersede take-over of a draining holder with a queued follow-up keeps the queue:
// the old holder's release (the key is no longer its) leaves it, and the new holder's
// release publishes it, once. Issue 34, item 3.
func TestTakeOverOfDrainingHolderPublishesItsQueue(t *testing.T) {
	t.Parallel()
	for _, format := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		for _, path := range releasePaths {
			t.Run(formatName(format)+"/"+path, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				rdb, ns := redistest.Client(t)
				l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Format: format})
				stream := ns + "s"
				h, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1-0", Drain: true})
				if err != nil {
					t.Fatal(err)
				}
				queueBehind(t, l, stream, "2-0")
				s, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "3-0", Supersede: true})
				if err != nil || s.Supersedes() != "1-0" {
					t.Fatalf("take-over: %v", err)
				}
				if deleted, err := h.Release(ctx); err != nil || deleted {
					t.Fatalf("the old holder's release: deleted %v, %v", deleted, err)
				}
				if n := rdb.XLen(ctx, stream).Val(); n != 0 || rdb.Exists(ctx, h.Keys().Queue).Val() != 1 {
					t.Fatalf("the old holder's release touched the new holder's queue (stream length %d)", n)
				}
				releaseBy(t, s, path, stream)
				published(t, rdb, s.Keys(), stream, "2-0")
			})
		}
	}
}

// A draining lease given back (its acquire not acknowledged by the replicas, or taken
// ahead for an entry that did not come) records no run: no done record, so an event
// of the issue that entered before still runs; a follow-up queued behind it meanwhile
// is published, not stranded. Issue 34, item 1.
func TestGiveBackOfDrainingLeaseRecordsNoRun(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"not replicated", "taken ahead"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rdb, ns := redistest.Client(t)
			l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second})
			stream := ns + "s"
			before := rdb.Time(ctx).Val()
			// The superseded check has millisecond resolution: give back in a later one.
			redistest.Eventually(t, 5*time.Second, func() bool {
				return rdb.Time(ctx).Val().UnixMilli() > before.UnixMilli()
			}, "Redis clock past %s", before)
			opts := lease.AcquireOptions{MessageID: "5-0", Drain: true}
			switch path {
			case "not replicated":
				// No replica is connected to the test server: WAIT answers 0.
				lw := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
				if _, err := lw.Acquire(ctx, "rebase", "RHEL-1", opts); !errors.Is(err, lease.ErrNotReplicated) {
					t.Fatalf("acquire: %v, want not replicated", err)
				}
			default:
				other := mustAcquire(t, l, "rebase", "RHEL-2")
				p, err := other.Handoff(ctx, lease.Entry{Stream: stream, Group: "g", ID: "4-0"},
					&lease.Next{Agent: "rebase", Key: "RHEL-1", Options: opts})
				if err != nil || p.Err() != nil {
					t.Fatalf("handoff: %v, %v", err, p.Err())
				}
				queueBehind(t, l, stream, "6-0")
				p.GiveBack(ctx)
				published(t, rdb, l.Keys("rebase", "RHEL-1"), stream, "6-0")
			}
			keys := l.Keys("rebase", "RHEL-1")
			if d, err := rdb.Get(ctx, keys.Done).Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("the give-back wrote a done record %q (%v): a run that never happened", d, err)
			}
			le, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "1-0", EntryTime: before, Drain: true})
			if err != nil {
				t.Fatalf("an event that entered before the give-back: %v, want it to run", err)
			}
			_, _ = le.Release(ctx)
		})
	}
}

func formatName(f lease.KeyFormat) string {
	if f == lease.KeysCluster {
		return "cluster"
	}
	return "standalone"
}
