package pipeline_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// roundTrips counts the commands and pipelines a client sends.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// In steady state the lease costs about one round trip per event on the shared client:
// the release, the XACK and the next event's acquire travel together. Without the
// handoff it would be two (acquire, then release+ack).
func TestLeaseRoundTripsPerEvent(t *testing.T) {
	e := newEnv(t)
	var rt roundTrips
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
	rt.n.Store(0)
	close(gate)
	redistest.Eventually(t, 30*time.Second, func() bool { return handled.Load() == n }, "all handled")
	per := float64(rt.n.Load()) / float64(n-1)
	t.Logf("%.2f round trips per event on the shared client", per)
	if per > 1.5 {
		t.Fatalf("%.2f round trips per event, want about 1 (release+ack+next acquire)", per)
	}
}
