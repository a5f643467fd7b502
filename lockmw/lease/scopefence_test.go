package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A lease's shared key (scope issue) force-released by an operator and taken by
// another agent's run ends the first lease's claim to the issue, not just at its next
// heartbeat: its fenced writes and its Check are refused at once, and its release does
// not report the run exclusive (the middleware acks a run whose lease ended under it
// only when the release deleted every key of it, still ours).
func TestFencedWritesCheckTheSharedKeys(t *testing.T) {
	t.Parallel()
	for name, format := range map[string]lease.KeyFormat{"standalone": lease.KeysCompat, "cluster keys": lease.KeysCluster} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			// No eviction watcher and a long heartbeat: only the checks themselves can tell.
			l := newLocker(t, rdb, ns, lease.Options{TTL: time.Minute, Format: format})
			ctx := context.Background()
			reb, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Shared: issueScope("RHEL-1"), MessageID: "1-1"})
			if err != nil {
				t.Fatal(err)
			}
			stream := ns + "{RHEL-1}out"
			if _, err := reb.XAdd(ctx, stream, 0, map[string]any{"k": "before"}); err != nil {
				t.Fatalf("fenced write while every key is held: %v", err)
			}
			if _, err := l.ForceRelease(ctx, "@issue", "RHEL-1"); err != nil {
				t.Fatal(err)
			}
			bp, err := l.Acquire(ctx, "backport", "RHEL-1", lease.AcquireOptions{Shared: issueScope("RHEL-1"), MessageID: "2-1"})
			if err != nil {
				t.Fatalf("backport after the shared key's force release: %v", err)
			}
			defer bp.Release(ctx)
			if _, err := reb.XAdd(ctx, stream, 0, map[string]any{"k": "after"}); !errors.Is(err, lease.ErrLeaseLost) {
				t.Errorf("fenced write after the shared key went to another run: %v, want ErrLeaseLost", err)
			}
			if err := reb.Check(ctx); !errors.Is(err, lease.ErrLeaseLost) {
				t.Errorf("Check after the shared key went to another run: %v, want ErrLeaseLost", err)
			}
			if n := rdb.XLen(ctx, stream).Val(); n != 1 {
				t.Errorf("%d entries written, want the one made while every key was held", n)
			}
			deleted, err := reb.Release(ctx)
			if err != nil || deleted {
				t.Errorf("release = %v, %v: want not reported as deleting the whole lease", deleted, err)
			}
			if err := bp.Check(ctx); err != nil {
				t.Errorf("the new holder's lease after the old one's release: %v", err)
			}
		})
	}
}
