package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A force release ends the holder's lease at once when its Locker watches evictions,
// not at its next heartbeat (TTL/3: ten seconds here); a lease taken after the force
// release is not ended by it.
func TestForceReleaseEndsTheWatchedLeaseAtOnce(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 30 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	go func() { watched <- l.WatchEvictions(ctx) }()
	redistest.Eventually(t, 5*time.Second, func() bool {
		return rdb.PubSubNumSub(ctx, l.EvictionChannel()).Val()[l.EvictionChannel()] == 1
	}, "the locker subscribed to %s", l.EvictionChannel())
	le := mustAcquire(t, l, "triage", "RHEL-1")
	op := newLocker(t, rdb, ns, lease.Options{Owner: "operator"})
	start := time.Now()
	if _, err := op.ForceRelease(ctx, "triage", "RHEL-1"); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, time.Second, func() bool { return le.Err() != nil }, "the evicted lease ends")
	if !errors.Is(le.Err(), lease.ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", le.Err())
	}
	t.Logf("evicted lease ended %s after the force release", time.Since(start).Round(time.Millisecond))
	next := mustAcquire(t, l, "triage", "RHEL-1")
	if err := next.Check(ctx); err != nil || next.Err() != nil {
		t.Fatalf("the lease taken after the force release: %v / %v", err, next.Err())
	}
	_, _ = next.Release(ctx)
	cancel()
	if err := <-watched; err != nil {
		t.Fatalf("WatchEvictions: %v", err)
	}
}
