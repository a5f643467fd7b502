package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A fenced append named by the caller (XAddOnce) is appended once across leases: the
// next holder's append with the same name adds nothing and returns the first entry's
// id; a new name under a lost lease is refused.
func TestXAddOnceAppendsOnceAcrossLeases(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLocker(t, rdb, ns, lease.Options{})
	stream := ns + "out"
	first := mustAcquire(t, l, "triage", "RHEL-8")
	id, err := first.XAddOnce(ctx, stream, 0, "outcome-1", time.Hour, map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := mustAcquire(t, l, "triage", "RHEL-8")
	again, err := next.XAddOnce(ctx, stream, 0, "outcome-1", time.Hour, map[string]any{"n": 2})
	if err != nil || again != id || rdb.XLen(ctx, stream).Val() != 1 {
		t.Fatalf("the next holder's append of the same name: %s, %v, %d entries; want %s, one entry", again, err, rdb.XLen(ctx, stream).Val(), id)
	}
	if _, err := first.XAddOnce(ctx, stream, 0, "outcome-2", time.Hour, map[string]any{"n": 3}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("a new append under the released lease: %v, want ErrLeaseLost", err)
	}
}
