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

// releaseAndAcquire ends an event on Redis Cluster: it releases le and acquires next
// in one round trip (a cluster pipeline, sent to each key's node), and only once the
// release has succeeded runs then (the XACK) in a second one. The stream is in another
// slot than the lease, and a cluster pipeline sends each node its commands
// concurrently, so one round trip could not keep the ack after the release. The
// pending lease's heartbeat runs from now on; its context is detached until take binds
// it to its event's context. Both scripts are sent by EVAL, so a server that lost its
// script cache cannot make the round trip half-fail.
func (le *Lease) releaseAndAcquire(ctx context.Context, then func(pipe redis.Pipeliner), next handoff) (bool, *pending, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	a, prepErr := le.l.prepare(next.agent, next.key, next.opts)
	pipe := le.l.rdb.Pipeline()
	rel := releaseScript.Eval(ctx, pipe, []string{le.keys.Lock, le.keys.Info, le.keys.Done}, le.token, le.messageID)
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
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lockmw: release %s: %w", le.keys.Lock, err)
	} else {
		err = le.afterRelease(ctx, then)
	}
	p := &pending{id: next.opts.MessageID, err: prepErr}
	if prepErr == nil {
		res, aerr := acq.Slice()
		p.lease, p.err = a.finish(context.Background(), res, aerr)
	}
	return n == 1, p, err
}

// releaseAck ends an event on standalone Redis in one round trip and one script
// (handoff.lua): release le, XACK e, and take next's lease if next is set. It is sent
// by EVALSHA; if the server lost the script, nothing ran and it is sent again by EVAL.
func (le *Lease) releaseAck(ctx context.Context, e Entry, next handoff, hasNext bool) (bool, *pending, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	var a *acquisition
	var p *pending
	if hasNext {
		var err error
		a, err = le.l.prepare(next.agent, next.key, next.opts)
		p = &pending{id: next.opts.MessageID, err: err}
	}
	// KEYS lock, info, done, stream[, next's 4]; ARGV token, message_id, group, entry
	// id[, next's 6], the lease's own by pointer (see acquisition.kv).
	args := append(scriptArgs(18), &le.keys.Lock, &le.keys.Info, &le.keys.Done, e.Stream)
	nkeys := 4
	if a != nil {
		args = append(args, a.kv[:4]...)
		nkeys = 8
	}
	var id any = &le.messageID // the entry's id, which the lease was taken for
	if e.ID != le.messageID {
		id = e.ID
	}
	args = append(args, &le.token, &le.messageID, e.Group, id)
	if a != nil {
		args = append(args, a.kv[4:]...)
	}
	res, err := runScript(ctx, le.l.rdb, handoffScript, nkeys, args).Slice()
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err == nil && len(res) < 2 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lockmw: release %s: %w", le.keys.Lock, err)
		if p != nil && p.err == nil {
			p.err = err
		}
		return false, p, err
	}
	if p != nil && p.err == nil {
		p.lease, p.err = a.finish(context.Background(), res[2:], nil)
	}
	return atoi(res[0]) == 1, p, nil
}

// handoffs holds a middleware's lease taken ahead, at most one, and gives it back if
// its entry does not arrive within handoffWindow.
type handoffs struct {
	mu      sync.Mutex
	pre     *pending
	expires time.Time
	// timer is one per middleware. It is armed by the first lease taken ahead and then
	// left running: when it fires, it gives back a lease whose window has passed, or
	// waits for the rest of the current one's, or stops if none is held. Stopping and
	// re-arming it for every event would cost a runtime timer insertion each, which
	// wakes another thread (the new timer is often the earliest).
	timer *time.Timer
	armed bool
}

// put keeps p as the lease taken ahead.
func (h *handoffs) put(p *pending) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pre, h.expires = p, time.Now().Add(handoffWindow)
	switch {
	case h.timer == nil:
		h.timer = time.AfterFunc(handoffWindow, h.expire)
	case !h.armed:
		h.timer.Reset(handoffWindow)
	}
	h.armed = true
}

// expire gives the lease taken ahead back once its window has passed. The next entry
// normally arrives within microseconds; if it never reaches the middleware
// (dead-lettered before it, or the subscription stops), the issue must not stay locked.
func (h *handoffs) expire() {
	h.mu.Lock()
	p := h.pre
	if p == nil {
		h.armed = false
		h.mu.Unlock()
		return
	}
	if wait := time.Until(h.expires); wait > 0 { // the timer was armed for an earlier lease
		h.timer.Reset(wait)
		h.mu.Unlock()
		return
	}
	h.pre, h.armed = nil, false
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	giveBack(ctx, p)
}

// takePre returns the lease taken ahead, if any, and forgets it. The timer runs on; it
// finds nothing to give back.
func (h *handoffs) takePre() *pending {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pre
	h.pre = nil
	return p
}

// close returns the lease taken ahead, if any, and stops the timer (the router has
// stopped: nothing is taken ahead any more).
func (h *handoffs) close() *pending {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pre
	h.pre = nil
	if h.timer != nil {
		h.timer.Stop()
		h.armed = false
	}
	return p
}

// giveBack returns a lease taken ahead whose entry did not come: no run happened
// under it, so its release records none (see Lease.giveBack).
func giveBack(ctx context.Context, p *pending) {
	if p != nil && p.lease != nil {
		p.lease.giveBack(ctx)
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

// releaseHandingOff releases lease and acks entry in one round trip (release first),
// taking the next entry's lease in it when the next entry is known.
func (m *Middleware) releaseHandingOff(ctx context.Context, lease *Lease, entry Entry) error {
	nx, hasNext := m.next(entry)
	var p *pending
	var err error
	switch {
	case lease.l.opts.Format != KeysCluster && !lease.drain:
		// Standalone: one script does all three.
		_, p, err = lease.releaseAck(ctx, entry, nx, hasNext)
	case hasNext:
		_, p, err = lease.releaseAndAcquire(ctx, m.ack(ctx, entry), nx)
	default:
		_, err = lease.ReleaseWith(ctx, m.ack(ctx, entry))
	}
	if p != nil && (p.lease != nil || errors.As(p.err, new(*LockedError)) || errors.As(p.err, new(*SupersededError))) {
		m.handoffs.put(p)
	}
	return err
}

// ack queues the XACK of entry (on Redis Cluster the stream and the lease are in
// different slots, so the ack is a command of its own behind the release script).
func (m *Middleware) ack(ctx context.Context, e Entry) func(redis.Pipeliner) {
	return func(pipe redis.Pipeliner) { pipe.XAck(ctx, e.Stream, e.Group, e.ID) }
}
