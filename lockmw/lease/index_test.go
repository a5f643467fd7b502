package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A follow-up that a release publishes is filed in its issue's index by xonce's own
// step, on both key formats (standalone: inside the release script; Cluster: through
// xonce.Run): the same keys, and the same bounds, among them that no id older than the
// stream's first entry stays (the release's copy of the step kept those).
func TestPublishedFollowupIsIndexedAsXonceIndexes(t *testing.T) {
	t.Parallel()
	for _, format := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		t.Run(formatName(format), func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			ctx := context.Background()
			l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second, Format: format})
			stream := ns + "s"
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Err(); err != nil {
				t.Fatal(err)
			}
			idx := xonce.IndexKey(stream, "RHEL-1")
			// An id from before the stream's first entry (the stream was trimmed since).
			rdb.ZAdd(ctx, idx, redis.Z{Score: 1, Member: "1-0000000000"})
			holder := mustAcquire(t, l, "rebase", "RHEL-1")
			_, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{MessageID: "5-0",
				Queue: &lease.QueuedEvent{Stream: stream, Fields: map[string]any{"k": "queued"}}})
			var locked *lease.LockedError
			if !errors.As(err, &locked) || !locked.Queued {
				t.Fatalf("acquire with a queue on a held lease: %v, want queued", err)
			}
			if _, err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			id := holder.Requeued()
			members := rdb.ZRange(ctx, idx, 0, -1).Val()
			if id == "" || len(members) != 1 || xonce.IndexID(members[0]) != id {
				t.Fatalf("index %s holds %v after the follow-up %q was published, want it alone", idx, members, id)
			}
			if rdb.Get(ctx, xonce.IndexSinceKey(stream)).Val() == "" {
				t.Errorf("%s not set", xonce.IndexSinceKey(stream))
			}
			if ttl := rdb.PTTL(ctx, idx).Val(); ttl <= 0 || ttl > xonce.IndexTTL {
				t.Errorf("index TTL %s, want in (0, %s]", ttl, xonce.IndexTTL)
			}
		})
	}
}
