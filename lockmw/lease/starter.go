package lease

import (
	"sync"
	"time"
)

// starter starts the heartbeats of a Locker's leases when their first extend is due.
// Most leases are released long before (events take milliseconds, the first extend is
// due after TTL/3), so a lease costs a place in this list, not a runtime timer of its
// own: inserting a timer takes the P's timer lock and, when the new timer is the
// earliest, wakes another thread. One timer, armed for the earliest lease, serves the
// Locker; it fires about once per TTL/3 while leases come and go.
type starter struct {
	mu         sync.Mutex
	head, tail *Lease // waiting leases by due time, linked through hbPrev and hbNext
	timer      *time.Timer
	armedFor   time.Time // when the timer fires; zero while it is not armed
}

// add puts le in the list; its heartbeat starts (le.startHeartbeat) at le.hbDue.
func (s *starter) add(le *Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Insert by due time, from the tail: leases mostly come in due order.
	at := s.tail
	for at != nil && at.hbDue.After(le.hbDue) {
		at = at.hbPrev
	}
	le.hbPrev, le.hbQueued = at, true
	if at == nil {
		le.hbNext, s.head = s.head, le
	} else {
		le.hbNext, at.hbNext = at.hbNext, le
	}
	if le.hbNext == nil {
		s.tail = le
	} else {
		le.hbNext.hbPrev = le
	}
	if s.armedFor.IsZero() || le.hbDue.Before(s.armedFor) {
		s.arm(le.hbDue)
	}
}

// remove takes le out of the list, if it is there. The timer is left as it is: when it
// fires, it re-arms for the earliest lease left, or disarms.
func (s *starter) remove(le *Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !le.hbQueued {
		return
	}
	if le.hbPrev == nil {
		s.head = le.hbNext
	} else {
		le.hbPrev.hbNext = le.hbNext
	}
	if le.hbNext == nil {
		s.tail = le.hbPrev
	} else {
		le.hbNext.hbPrev = le.hbPrev
	}
	le.hbPrev, le.hbNext, le.hbQueued = nil, nil, false
}

// arm has the timer fire at t. The caller holds s.mu.
func (s *starter) arm(t time.Time) {
	s.armedFor = t
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(t), s.fire)
		return
	}
	s.timer.Reset(time.Until(t))
}

// fire starts the heartbeats that are due and re-arms the timer for the next one.
func (s *starter) fire() {
	s.mu.Lock()
	now := time.Now()
	var due []*Lease
	for s.head != nil && !s.head.hbDue.After(now) {
		le := s.head
		s.head = le.hbNext
		le.hbPrev, le.hbNext, le.hbQueued = nil, nil, false
		due = append(due, le)
	}
	if s.head == nil {
		s.tail = nil
		s.armedFor = time.Time{}
	} else {
		s.head.hbPrev = nil
		s.arm(s.head.hbDue)
	}
	s.mu.Unlock()
	for _, le := range due {
		go le.startHeartbeat()
	}
}
