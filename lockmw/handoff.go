package lockmw

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The handoff: when the subscription knows the entry it delivers next (Peeker), the
// middleware takes that entry's lease in the round trip that releases the current one
// and acks its entry (lease.Lease.Handoff). The lease then costs no round trip of its
// own on the critical path. A lease taken ahead is bound to its event when the event
// arrives, and given back if another event arrives instead, if the router stops, or
// after handoffWindow.

// handoffWindow bounds how long a lease taken ahead waits for its entry.
const handoffWindow = time.Second

// handoffs holds a middleware's lease taken ahead, at most one, and gives it back if
// its entry does not arrive within handoffWindow.
type handoffs struct {
	mu      sync.Mutex
	pre     *lease.Pending
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
func (h *handoffs) put(p *lease.Pending) {
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
	p.GiveBack(ctx)
}

// takePre returns the lease taken ahead, if any, and forgets it. The timer runs on; it
// finds nothing to give back.
func (h *handoffs) takePre() *lease.Pending {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pre
	h.pre = nil
	return p
}

// close returns the lease taken ahead, if any, and stops the timer (the router has
// stopped: nothing is taken ahead any more).
func (h *handoffs) close() *lease.Pending {
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

// next names the lease to take ahead for the entry the subscription delivers after
// cur, if it is known.
func (m *Middleware) next(cur Entry) (lease.Next, bool) {
	pk, ok := m.cfg.Source.(Peeker)
	if !ok || !m.takeAhead {
		return lease.Next{}, false
	}
	id, raw, ok := pk.Peek()
	if !ok || id == cur.ID || raw == "" {
		return lease.Next{}, false
	}
	if _, err := m.cfg.Locker.Canonicalize(raw); err != nil {
		return lease.Next{}, false // a bad event: the dead-letter path takes it, lockless
	}
	next := cur
	next.ID = id
	return lease.Next{Agent: m.cfg.Agent, Key: raw, Options: m.acquireOptions(next)}, true
}

// releaseHandingOff releases le and acks entry in one round trip (release first),
// taking the next entry's lease in it when the next entry is known. A lease taken
// ahead is kept for its entry when Redis gave a verdict (held, or busy: the entry then
// meets the conflict without a round trip of its own), not after a Redis error.
func (m *Middleware) releaseHandingOff(ctx context.Context, le *lease.Lease, entry Entry) error {
	e := lease.Entry{Stream: entry.Stream, Group: entry.Group, ID: entry.ID}
	var p *lease.Pending
	var err error
	if nx, ok := m.next(entry); ok {
		p, err = le.Handoff(ctx, e, &nx)
	} else {
		p, err = le.Handoff(ctx, e, nil)
	}
	if p != nil && (p.Err() == nil || errors.As(p.Err(), new(*lease.LockedError)) || errors.As(p.Err(), new(*lease.SupersededError))) {
		m.handoffs.put(p)
	}
	return err
}
