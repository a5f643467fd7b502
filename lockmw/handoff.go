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
const handoffWindow = 250 * time.Millisecond

// ahead is a lease taken ahead: its entry and its issue (canonical; "" when unknown).
type ahead struct {
	p     *lease.Pending
	issue string
}

// handoffs holds a middleware's leases taken ahead, in the order their entries come
// (one after a slow run, up to batchAhead after a quick one: batch.go), and gives them
// back if their entries do not arrive within handoffWindow.
type handoffs struct {
	mu      sync.Mutex
	pre     []ahead
	expires time.Time
	// timer is one per middleware. It is armed by the first lease taken ahead and then
	// left running: when it fires, it gives back the leases whose window has passed, or
	// waits for the rest of the current ones', or stops if none is held. Stopping and
	// re-arming it for every event would cost a runtime timer insertion each, which
	// wakes another thread (the new timer is often the earliest).
	timer *time.Timer
	armed bool
}

// put keeps ps (in their entries' order) as leases taken ahead.
func (h *handoffs) put(ps ...ahead) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pre = append(h.pre, ps...)
	h.expires = time.Now().Add(handoffWindow)
	switch {
	case h.timer == nil:
		h.timer = time.AfterFunc(handoffWindow, h.expire)
	case !h.armed:
		h.timer.Reset(handoffWindow)
	}
	h.armed = true
}

// expire gives the leases taken ahead back once their window has passed. The next
// entry normally arrives within microseconds; if it never reaches the middleware
// (dead-lettered before it, or the subscription stops), the issue must not stay locked.
func (h *handoffs) expire() {
	h.mu.Lock()
	if len(h.pre) == 0 {
		h.armed = false
		h.mu.Unlock()
		return
	}
	if wait := time.Until(h.expires); wait > 0 { // the timer was armed for earlier leases
		h.timer.Reset(wait)
		h.mu.Unlock()
		return
	}
	pre := h.pre
	h.pre, h.armed = nil, false
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	giveBack(ctx, pre)
}

// giveBack gives back the leases of pre.
func giveBack(ctx context.Context, pre []ahead) {
	for _, a := range pre {
		a.p.GiveBack(ctx)
	}
}

// takePre returns the lease taken ahead for entry id, if any, and forgets it. The
// leases taken ahead for entries before it, which the subscription did not hand over
// (a bad event dead-lettered first), are returned in skipped, to be given back; so are
// all of them when id has none (the subscription handed over another entry than
// announced). Leases for later entries stay. The timer runs on; it finds nothing to
// give back once all are taken.
func (h *handoffs) takePre(id string) (p *lease.Pending, skipped []ahead) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, a := range h.pre {
		if a.p.MessageID() == id {
			skipped = h.pre[:i:i]
			h.pre = h.pre[i+1:]
			return a.p, skipped
		}
	}
	skipped, h.pre = h.pre, nil
	return nil, skipped
}

// has reports whether a lease is held ahead for entry id.
func (h *handoffs) has(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.pre {
		if a.p.MessageID() == id {
			return true
		}
	}
	return false
}

// issues returns the entries and issues of the leases taken ahead.
func (h *handoffs) issues() (ids, issues map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids, issues = make(map[string]bool, len(h.pre)), make(map[string]bool, len(h.pre))
	for _, a := range h.pre {
		ids[a.p.MessageID()] = true
		if a.issue != "" {
			issues[a.issue] = true
		}
	}
	return ids, issues
}

// close returns the leases taken ahead and stops the timer (the router has stopped:
// nothing is taken ahead any more).
func (h *handoffs) close() []ahead {
	h.mu.Lock()
	defer h.mu.Unlock()
	pre := h.pre
	h.pre = nil
	if h.timer != nil {
		h.timer.Stop()
		h.armed = false
	}
	return pre
}

// next names the lease to take ahead for the entry the subscription delivers after
// cur, if it is known, and its canonical issue.
func (m *Middleware) next(cur Entry) (lease.Next, string, bool) {
	if m.peeker == nil || !m.takeAhead {
		return lease.Next{}, "", false
	}
	id, raw, ok := m.peeker.Peek()
	if !ok || id == cur.ID || raw == "" {
		return lease.Next{}, "", false
	}
	issue, err := m.cfg.Locker.Canonicalize(raw)
	if err != nil {
		return lease.Next{}, "", false // a bad event: the dead-letter path takes it, lockless
	}
	return m.nextFor(cur, id, raw), issue, true
}

// nextFor is the lease to take ahead for entry id (raw issue key raw) of cur's stream.
func (m *Middleware) nextFor(cur Entry, id, raw string) lease.Next {
	next := cur
	next.ID = id
	// With the pauses, a batch checks them in its own script (lease.Pending.PauseChecked).
	return lease.Next{Agent: m.cfg.Agent, Key: raw, Options: m.acquireOptions(next), Pauses: m.cfg.Pauses, Stream: cur.Stream}
}

// releaseHandingOff releases le and acks entry in one round trip (release first),
// taking the next entry's lease in it when the next entry is known. A lease taken
// ahead is kept for its entry when Redis gave a verdict (keep).
func (m *Middleware) releaseHandingOff(ctx context.Context, le *lease.Lease, entry Entry) error {
	e := lease.Entry{Stream: entry.Stream, Group: entry.Group, ID: entry.ID}
	var p *lease.Pending
	var err error
	nx, issue, ok := m.next(entry)
	if ok {
		p, err = le.Handoff(ctx, e, &nx)
	} else {
		p, err = le.Handoff(ctx, e, nil)
	}
	if keep(p) {
		m.handoffs.put(ahead{p: p, issue: issue})
	}
	return err
}

// keep reports whether a lease taken ahead is kept for its entry: Redis gave a verdict
// (held, or busy: the entry then meets the conflict without a round trip of its own),
// not an error.
func keep(p *lease.Pending) bool {
	return p != nil && (p.Err() == nil || errors.As(p.Err(), new(*lease.LockedError)) || errors.As(p.Err(), new(*lease.SupersededError)))
}
