package pipeline_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// In steady state the lease costs about one round trip per event on the shared client:
// the release, the XACK and the next event's acquire travel together. Without the
// handoff it would be two (acquire, then release+ack).
func TestLeaseRoundTripsPerEvent(t *testing.T) {
	// Not parallel: it counts round trips per event, and a heartbeat that a busy machine delays into the count would change it.
	e := newEnv(t)
	var rt redistest.RoundTrips
	e.rdb.AddHook(&rt)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 300
	var handled atomic.Int64
	gate := make(chan struct{})
	e.start(ctx, routerOpts{}, func(msg *message.Message) error {
		if handled.Add(1) == 1 {
			<-gate // let the whole batch queue up behind the first event
		}
		return nil
	})
	for i := range n {
		e.publishTriage("RHEL-" + strconv.Itoa(i+1))
	}
	rt.Reset()
	close(gate)
	redistest.Eventually(t, 30*time.Second, func() bool { return handled.Load() == n }, "all handled")
	per := float64(rt.Count()) / float64(n-1)
	t.Logf("%.2f round trips per event on the shared client", per)
	if per > 1.2 {
		t.Fatalf("%.2f round trips per event, want about 1 (release+ack+next acquire; the next entry is read ahead in batches, or waited for)", per)
	}
}
