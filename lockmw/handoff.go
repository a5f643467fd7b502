package lockmw

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The handoff: when the subscription knows the entry it delivers next (Peeker), the
// middleware takes that entry's lease in the round trip that releases the current one
// and acks its entry. The lease then costs no round trip of its own on the critical
// path. A lease taken ahead is bound to its event when the event arrives, and given
// back if another event arrives instead, if the router stops, or after handoffWindow.

// handoffWindow bounds how long a lease taken ahead waits for its entry.
const handoffWindow = time.Second

// handoff names the next event's lease.
type handoff struct {
	agent, key string
	opts       AcquireOptions // Queue is not supported here
}

// pending is a lease taken ahead of its event: bound to the event's context with take,
// or given back with Release.
type pending struct {
	id    string // the stream entry it was taken for
	lease *Lease // nil when err is set
	err   error  // *LockedError, *SupersededError, an ErrInvalidKey or a Redis error
}

// take ties the pending lease to ctx (the event's context): cancelling ctx cancels the
// lease's context with ctx's cause, as for a lease acquired under ctx.
func (p *pending) take(ctx context.Context) (*Lease, error) {
	if p.err != nil {
		return nil, p.err
	}
	le := p.lease
	le.unbind = context.AfterFunc(ctx, func() { le.cancel(context.Cause(ctx)) })
	return le, nil
}

// releaseAndAcquire releases le, runs then (an XACK), and acquires next, in this order
// and in one round trip. The pending lease's heartbeat runs from now on; its context is
// detached until take binds it to its event's context. Both scripts are sent by EVAL,
// so a server that lost its script cache cannot make the round trip half-fail.
func (le *Lease) releaseAndAcquire(ctx context.Context, then func(pipe redis.Pipeliner), next handoff) (bool, *pending, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	a, prepErr := le.l.prepare(next.agent, next.key, next.opts)
	pipe := le.l.rdb.Pipeline()
	rel := releaseScript.Eval(ctx, pipe, []string{le.keys.Lock, le.keys.Info, le.keys.Done}, le.token)
	if then != nil {
		then(pipe)
	}
	var acq *redis.Cmd
	if prepErr == nil {
		acq = acquireScript.Eval(ctx, pipe, a.scriptKeys(), a.args...)
	}
	_, _ = pipe.Exec(ctx)
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	n, err := rel.Int64()
	if err != nil {
		le.log.Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lockmw: release %s: %w", le.keys.Lock, err)
	}
	p := &pending{id: next.opts.MessageID, err: prepErr}
	if prepErr == nil {
		res, aerr := acq.Slice()
		p.lease, p.err = a.finish(context.Background(), res, aerr)
	}
	return n == 1, p, err
}

// handoffs holds a middleware's lease taken ahead, at most one.
type handoffs struct {
	mu  sync.Mutex
	pre *pending
}

// takePre returns the lease taken ahead, if any, and forgets it.
func (h *handoffs) takePre() *pending {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pre
	h.pre = nil
	return p
}

func giveBack(ctx context.Context, p *pending) {
	if p != nil && p.lease != nil {
		_, _ = p.lease.Release(ctx)
	}
}

// next returns the handoff for the entry the subscription delivers after cur.
func (m *Middleware) next(cur Entry) (handoff, bool) {
	pk, ok := m.cfg.Source.(Peeker)
	if !ok || m.cfg.Policy != Drop {
		return handoff{}, false
	}
	id, raw, ok := pk.Peek()
	if !ok || id == cur.ID || raw == "" {
		return handoff{}, false
	}
	if _, err := m.cfg.Locker.Canonicalize(raw); err != nil {
		return handoff{}, false // a bad event: the dead-letter path takes it, lockless
	}
	next := cur
	next.ID = id
	return handoff{agent: m.cfg.Agent, key: raw, opts: m.acquireOptions(next)}, true
}

// releaseHandingOff releases lease and runs ack in one round trip, taking the next
// entry's lease in it when the next entry is known.
func (m *Middleware) releaseHandingOff(ctx context.Context, lease *Lease, entry Entry, ack func(redis.Pipeliner)) error {
	nx, ok := m.next(entry)
	if !ok {
		_, err := lease.ReleaseWith(ctx, ack)
		return err
	}
	_, p, err := lease.releaseAndAcquire(ctx, ack, nx)
	if p.lease == nil && !errors.As(p.err, new(*LockedError)) && !errors.As(p.err, new(*SupersededError)) {
		return err // not worth keeping: the event acquires on its own
	}
	m.handoffs.mu.Lock()
	m.handoffs.pre = p
	m.handoffs.mu.Unlock()
	// The next entry normally arrives within microseconds. If it never reaches this
	// middleware (dead-lettered before it, or the subscription stops), the issue must
	// not stay locked: give the lease back after a while.
	time.AfterFunc(handoffWindow, func() {
		m.handoffs.mu.Lock()
		stale := m.handoffs.pre == p
		if stale {
			m.handoffs.pre = nil
		}
		m.handoffs.mu.Unlock()
		if stale {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			giveBack(ctx, p)
		}
	})
	return err
}
