package pipeline_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// A router is listed in the workers' presence as soon as it runs (the console and
// `ymirflow workers` ask then), even when its first beat is slow: here the reply of its
// first read is lost, and go-redis sends it again 300 ms later.
func TestRunningRouterIsPresent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy := redistest.NewLossyProxy(t, e.rdb.Options().Addr)
	opts := *e.rdb.Options()
	opts.Addr = proxy.Addr()
	opts.MinRetryBackoff, opts.MaxRetryBackoff = 300*time.Millisecond, 300*time.Millisecond
	client := redis.NewClient(&opts)
	t.Cleanup(func() { _ = client.Close() })
	// A beat reads the drain requests before it writes: the first beat's read (the
	// second of the drain requests, after the router's start-up read) is made slow.
	readDrains, n := redistest.Command("hgetall", e.topo.Drains()), atomic.Int32{}
	proxy.LoseReply(func(args []string) bool { return readDrains(args) && n.Add(1) == 2 }, 1)
	cfg := e.Config("triage", "", "w1", e.locker(3*time.Second), func(*message.Message) error { return nil })
	cfg.Client = client
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.Start(ctx, cfg)
	if _, ok := e.drainState("w1-0"); !ok {
		t.Fatalf("the router runs, yet w1-0 is not in %s (replies lost: %d)", e.topo.Workers(), proxy.Cuts())
	}
}
