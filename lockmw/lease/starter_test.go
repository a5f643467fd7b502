package lease

import (
	"testing"
	"time"
)

// The starter keeps its leases by due time whatever order they come in and leave in,
// and its timer armed for the earliest.
func TestStarterOrder(t *testing.T) {
	t.Parallel()
	var s starter
	t0 := time.Now().Add(time.Hour) // nothing falls due during the test
	lease := func(min int) *Lease { return &Lease{hbDue: t0.Add(time.Duration(min) * time.Minute)} }
	order := func() []int {
		var got []int
		prev := (*Lease)(nil)
		for le := s.head; le != nil; le = le.hbNext {
			if le.hbPrev != prev {
				t.Fatal("broken back link")
			}
			got = append(got, int(le.hbDue.Sub(t0)/time.Minute))
			prev = le
		}
		if s.tail != prev {
			t.Fatal("tail is not the last lease")
		}
		return got
	}
	l5, l3, l7, l1, l6 := lease(5), lease(3), lease(7), lease(1), lease(6)
	for _, le := range []*Lease{l5, l3, l7, l1, l6} {
		s.add(le)
	}
	if got := order(); len(got) != 5 || got[0] != 1 || got[1] != 3 || got[2] != 5 || got[3] != 6 || got[4] != 7 {
		t.Fatalf("order %v", got)
	}
	if !s.armedFor.Equal(l1.hbDue) {
		t.Fatalf("armed for %v, want the earliest lease's %v", s.armedFor, l1.hbDue)
	}
	s.remove(l1)
	s.remove(l7)
	s.remove(l5)
	s.remove(l5) // idempotent
	if got := order(); len(got) != 2 || got[0] != 3 || got[1] != 6 {
		t.Fatalf("order after removals %v", got)
	}
	s.remove(l3)
	s.remove(l6)
	if s.head != nil || s.tail != nil {
		t.Fatal("list not empty")
	}
	s.timer.Stop()
}
