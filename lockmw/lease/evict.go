package lease

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Evictions: ForceRelease announces each eviction on a Pub/Sub channel, and a Locker
// that watches it (WatchEvictions) ends the evicted lease at once, with ErrLeaseLost,
// rather than at its next heartbeat (up to TTL/3 later). A missed announcement (the
// subscription was reconnecting) costs only that delay: the heartbeat still finds the
// key gone.

// evictions are the live leases of a watching Locker: a handful (one per subscription
// of a worker), so an eviction looks at each rather than indexing them by key, which
// would cost an allocation per lease.
type evictions struct {
	mu   sync.Mutex
	on   bool
	live map[*Lease]struct{}
}

func (e *evictions) track(le *Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.on {
		e.live[le] = struct{}{}
	}
}

func (e *evictions) untrack(le *Lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.live, le)
}

// EvictionChannel is the Pub/Sub channel on which this Locker's ForceRelease announces
// evictions ("<lock key> <new fence>").
func (l *Locker) EvictionChannel() string { return l.opts.Scope + "lockevict" }

// WatchEvictions subscribes to EvictionChannel and, until ctx ends, ends each lease of
// this Locker that a force release evicts, at once: its context is cancelled with a
// cause wrapping ErrLeaseLost, so the holder stops its work. The subscription
// reconnects by itself after a Redis outage; announcements made meanwhile are missed
// (the heartbeat covers them). It returns nil when ctx ends.
func (l *Locker) WatchEvictions(ctx context.Context) error {
	l.evict.mu.Lock()
	l.evict.on, l.evict.live = true, map[*Lease]struct{}{}
	l.evict.mu.Unlock()
	defer func() {
		l.evict.mu.Lock()
		l.evict.on, l.evict.live = false, nil
		l.evict.mu.Unlock()
	}()
	// Channel reads in its own goroutine, which Close ends: a Receive here would block
	// on a client that does not honour ctx while it reads (ContextTimeoutEnabled off),
	// and keep the caller from returning.
	ps := l.rdb.Subscribe(context.WithoutCancel(ctx), l.EvictionChannel())
	defer func() { _ = ps.Close() }()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			l.evicted(m.Payload)
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
	l.evict.mu.Lock()
	var gone []*Lease
	for le := range l.evict.live {
		if le.keys.Lock == key && le.fence < fence {
			gone = append(gone, le)
		}
	}
	l.evict.mu.Unlock()
	for _, le := range gone {
		if by != "" {
			le.end(&SupersededByError{Agent: le.agent, Issue: le.issue, ByMessageID: by, Fence: fence})
			continue
		}
		le.end(fmt.Errorf("%w: force-released by an operator (fence now %d)", ErrLeaseLost, fence))
	}
}
