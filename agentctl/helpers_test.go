package agentctl_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// world is one test's Redis namespace, its locker and ledger.
type world struct {
	rdb    *redis.Client
	ns     string
	locker *lease.Locker
	ledger *agentctl.Ledger
}

func newWorld(t *testing.T, b agentctl.Budgets, ttl time.Duration) *world {
	t.Helper()
	rdb, ns := redistest.Client(t)
	lk, err := lease.New(rdb, lease.Options{Scope: ns, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	lg, err := agentctl.NewLedger(rdb, ns, b)
	if err != nil {
		t.Fatal(err)
	}
	return &world{rdb: rdb, ns: ns, locker: lk, ledger: lg}
}

// acquire takes the lease of agent on issue (released when the test ends).
func (w *world) acquire(t *testing.T, agent, issue string) (*lease.Lease, agentctl.Run) {
	t.Helper()
	le, err := w.locker.Acquire(context.Background(), agent, issue, lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = le.Release(context.Background()) })
	return le, agentctl.RunOf(le)
}

func (w *world) spent(t *testing.T, issue string) int64 {
	t.Helper()
	v, err := w.rdb.HGet(context.Background(), w.ns+"ctl:{"+issue+"}:ledger", "spent").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return v
}
