package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A lease with shared keys (scopes issue and group) is held only while every one of its
// lock keys holds its token: a shared key force-released and taken by another agent's
// run ends this run's claim to the issue even though its own key is still there. The
// fenced checks (Check, XAdd) and the release's "deleted" therefore look at all of them
// (docs/architecture.md, "Edge cases settled").

// sharedLocks are the lock keys of the lease's shared keys, in the fixed order.
func (le *Lease) sharedLocks() []string {
	if len(le.shared) == 0 {
		return nil
	}
	keys := make([]string, len(le.shared))
	for i, s := range le.shared {
		keys[i] = s.Keys.Lock
	}
	return keys
}

// checkLocks proves in one round trip that the lease's own lock key and each shared
// one hold its token (on Redis Cluster they share a hash slot: scopedKeys).
func (le *Lease) checkLocks(ctx context.Context) error {
	if len(le.shared) == 0 {
		v, err := le.l.rdb.Get(ctx, le.keys.Lock).Result()
		if errors.Is(err, redis.Nil) || (err == nil && v != le.token) {
			return fmt.Errorf("%w: %s is not ours", ErrLeaseLost, le.keys.Lock)
		}
		if err != nil {
			return fmt.Errorf("lease: check %s: %w", le.keys.Lock, err)
		}
		return nil
	}
	keys := append([]string{le.keys.Lock}, le.sharedLocks()...)
	// Client has no MGET of its own (the lease needs few commands): a one-command pipeline.
	pipe := le.l.rdb.Pipeline()
	cmd := pipe.MGet(ctx, keys...)
	_, _ = pipe.Exec(ctx)
	vals, err := cmd.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("lease: check %s: %w", le.keys.Lock, err)
	}
	for i, v := range vals {
		if s, ok := v.(string); !ok || s != le.token {
			return fmt.Errorf("%w: %s is not ours", ErrLeaseLost, keys[i])
		}
	}
	return nil
}
