package lease

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// tallied is a Locker in a namespace of its own whose Observer counts the ends.
func tallied(t *testing.T) (*Locker, *endTally, string) {
	rdb, ns := redistest.Client(t)
	tally := &endTally{}
	l, err := New(rdb, Options{Scope: ns, Observer: tally})
	if err != nil {
		t.Fatal(err)
	}
	return l, tally, ns
}

// An eviction and the eviction watch's catch-up may end one lease at the same time: the
// loss is logged and counted once (it was counted as often as it was ended).
func TestLossCountedOnceWhenEndedTwiceAtOnce(t *testing.T) {
	t.Parallel()
	l, tally, _ := tallied(t)
	const leases = 40
	for i := range leases {
		le, err := l.Acquire(context.Background(), "triage", "RHEL-"+strconv.Itoa(i+1), AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				le.end(ErrLeaseLost)
			}()
		}
		close(start)
		wg.Wait()
		_ = le.GiveBack(context.Background())
	}
	if n := tally.lost.Load(); n != leases {
		t.Fatalf("%d losses counted for %d leases ended", n, leases)
	}
}

// A lease that is lost (an eviction, a heartbeat's verdict) as its holder releases it
// ends once in the counts: released or lost, never both. (Counted both ways, the held
// time and the losses of one agent told two stories of one run.)
func TestLeaseEndCountedOnceWhenLostAsReleased(t *testing.T) {
	t.Parallel()
	l, tally, ns := tallied(t)
	ctx := context.Background()
	ends := []struct {
		name    string
		release func(*Lease, int) error
	}{
		{"release", func(le *Lease, _ int) error { _, err := le.Release(ctx); return err }},
		{"give back", func(le *Lease, _ int) error { return le.GiveBack(ctx) }},
		{"handoff", func(le *Lease, i int) error {
			_, err := le.Handoff(ctx, Entry{Stream: ns + "s", Group: "g", ID: strconv.Itoa(i+1) + "-0"}, nil)
			return err
		}},
		{"batch", func(le *Lease, i int) error {
			_, err := l.HandoffBatch(ctx, []End{{Lease: le, Entry: Entry{Stream: ns + "s", Group: "g", ID: strconv.Itoa(i+1) + "-0"}, EndedAt: time.Now()}}, nil)
			return err
		}},
	}
	const leases = 30
	n := 0
	for _, end := range ends {
		for i := range leases {
			n++
			le, err := l.Acquire(ctx, "triage", "RHEL-"+strconv.Itoa(n), AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); <-start; le.end(ErrLeaseLost) }()
			go func() { defer wg.Done(); <-start; _ = end.release(le, i) }()
			close(start)
			wg.Wait()
		}
		if r, lo := tally.released.Load(), tally.lost.Load(); r+lo != int64(n) {
			t.Fatalf("%s: %d leases ended, counted %d released and %d lost", end.name, n, r, lo)
		}
	}
}
