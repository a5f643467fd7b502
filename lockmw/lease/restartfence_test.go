package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Fences come from a counter in Redis: a server with an append-only file (fsync
// always) keeps it across a restart and the next fence is higher; a server that
// persists nothing starts it again at 1, and a fence repeats. That is the server's
// configuration, not something the lease can repair: the worker warns about it at
// start, or refuses it (pipeline.CheckPersistence; docs/architecture.md, "Edge cases
// settled", says why fences are not seeded from the clock instead).
func TestFencesAfterARedisRestart(t *testing.T) {
	t.Parallel()
	for name, aof := range map[string]bool{"aof": true, "no persistence": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartServer(t, redistest.ServerOptions{AOF: aof})
			l := newLocker(t, srv.Client(), "", lease.Options{TTL: time.Minute})
			ctx := context.Background()
			first := mustAcquire(t, l, "rebase", "RHEL-1")
			if _, err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			srv.Restart()
			var next *lease.Lease
			redistest.Eventually(t, 10*time.Second, func() bool {
				var err error
				next, err = l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{})
				return err == nil
			}, "an acquire after the restart")
			defer next.Release(ctx)
			if repeated := next.Fence() <= first.Fence(); repeated != !aof {
				t.Errorf("fence %d after %d across a restart (aof %v)", next.Fence(), first.Fence(), aof)
			}
		})
	}
}
