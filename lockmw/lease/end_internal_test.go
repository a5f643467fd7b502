package lease

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// lostCounter is an Observer that counts losses.
type lostCounter struct{ n *atomic.Int64 }

func (o lostCounter) Acquired(string)                 {}
func (o lostCounter) Busy(string)                     {}
func (o lostCounter) Conflict(string, string, string) {}
func (o lostCounter) Released(string, time.Duration)  {}
func (o lostCounter) Lost(string, error)              { o.n.Add(1) }

// An eviction and the eviction watch's catch-up may end one lease at the same time: the
// loss is logged and counted once. (Counted twice, a test waiting for a lease's loss
// was woken by another lease's second count: lockmw TestPauseStopsLeaseTakenAhead.)
func TestLossCountedOnceWhenEndedTwiceAtOnce(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	var lost atomic.Int64
	l, err := New(rdb, Options{Scope: ns, Observer: lostCounter{&lost}})
	if err != nil {
		t.Fatal(err)
	}
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
	if n := lost.Load(); n != leases {
		t.Fatalf("%d losses counted for %d leases ended", n, leases)
	}
}
