package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Evictions: ForceRelease announces each eviction on a Pub/Sub channel, and a Locker
// that watches it (WatchEvictions) ends the evicted lease at once, with ErrLeaseLost,
// rather than at its next heartbeat (up to TTL/3 later); a supersede's take-over is
// announced the same way. Pub/Sub loses what is published while nobody listens: before
// the first SUBSCRIBE is in place (the watch starts beside the first events, and a
// loaded machine may run it late) and while the subscription reconnects (go-redis
// reconnects when a health-check PING goes unanswered). So every (re)subscription is
// followed by a catch-up: each live lease of the Locker whose key is no longer its
// own ends then, as if its announcement had come (catchUp). Leases are tracked from
// their acquire on, watched or not, for that.

// evictions are the live leases of a Locker: a handful (one per subscription of a
// worker), so an eviction looks at each rather than indexing them by key, which
// would cost an allocation per lease.
type evictions struct {
	mu   sync.Mutex
	live map[*Lease]struct{}
}

func (e *evictions) track(le *Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.live == nil {
		e.live = map[*Lease]struct{}{}
	}
	e.live[le] = struct{}{}
}

func (e *evictions) untrack(le *Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.live, le)
}

// leases returns the live leases whose lock key satisfies keep (all, for nil).
func (e *evictions) leases(keep func(le *Lease) bool) []*Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*Lease
	for le := range e.live {
		if keep == nil || keep(le) {
			out = append(out, le)
		}
	}
	return out
}

// EvictionChannel is the Pub/Sub channel on which this Locker's ForceRelease announces
// evictions ("<lock key> <new fence>").
func (l *Locker) EvictionChannel() string { return l.opts.Scope + "lockevict" }

// WatchEvictions subscribes to EvictionChannel and, until ctx ends, ends each lease of
// this Locker that a force release evicts or a newer event takes over, at once: its
// context is cancelled with a cause wrapping ErrLeaseLost, so the holder stops its
// work. The subscription reconnects by itself after a Redis outage; once subscribed
// (first or again) it checks every live lease's key, so an announcement made while it
// was not subscribed ends its lease then. It returns nil when ctx ends.
func (l *Locker) WatchEvictions(ctx context.Context) error {
	// Channel reads in its own goroutine, which Close ends: a Receive here would block
	// on a client that does not honour ctx while it reads (ContextTimeoutEnabled off),
	// and keep the caller from returning.
	ps := l.rdb.Subscribe(context.WithoutCancel(ctx), l.EvictionChannel())
	defer func() { _ = ps.Close() }()
	ch := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					l.catchUp(ctx)
				}
			case *redis.Message:
				l.evicted(m.Payload)
			}
		}
	}
}

// catchUp ends, as its announcement would have, each live lease whose lock key no
// longer holds its token (one pipelined GET per lease): taken over by a newer event (a
// *SupersededByError, read from the stop hash) or evicted (ErrLeaseLost). A failed
// round trip ends nothing: the heartbeat still finds them.
func (l *Locker) catchUp(ctx context.Context) {
	live := l.evict.leases(nil)
	if len(live) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pipe := l.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(live))
	for i, le := range live {
		gets[i] = pipe.Get(cctx, le.keys.Lock)
	}
	if _, err := pipe.Exec(cctx); err != nil && !errors.Is(err, redis.Nil) {
		return
	}
	for i, le := range live {
		if v, err := gets[i].Result(); (err == nil || errors.Is(err, redis.Nil)) && v != le.token && le.ctx.Err() == nil {
			le.end(le.notOurs())
		}
	}
}

// announceSupersede announces that the newer event by took lock over with fence (the
// supersede policy): "<lock key> <new fence> <newer message id>". A failure is only
// logged: the old holder's heartbeat finds the key taken.
func (l *Locker) announceSupersede(ctx context.Context, lock string, fence int64, by string) {
	payload := lock + " " + strconv.FormatInt(fence, 10) + " " + by
	pipe := l.rdb.Pipeline()
	pipe.Publish(ctx, l.EvictionChannel(), payload)
	if _, err := pipe.Exec(ctx); err != nil {
		l.opts.Logger.Warn().Err(err).Str("lock", lock).Msg("could not announce a supersede; the old holder stops at its next heartbeat")
	}
}

// evicted ends the leases of key older than the fence that a force release ("<key>
// <fence>") or a newer event's take-over ("<key> <fence> <newer message id>") took.
func (l *Locker) evicted(payload string) {
	f := strings.Fields(payload)
	if len(f) < 2 {
		return
	}
	key := f[0]
	fence, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return
	}
	by := ""
	if len(f) >= 3 {
		by = f[2]
	}
	for _, le := range l.evict.leases(func(le *Lease) bool { return le.keys.Lock == key && le.fence < fence }) {
		if by != "" {
			le.end(&SupersededByError{Agent: le.agent, Issue: le.issue, ByMessageID: by, Fence: fence})
			continue
		}
		le.end(fmt.Errorf("%w: force-released by an operator (fence now %d)", ErrLeaseLost, fence))
	}
}
