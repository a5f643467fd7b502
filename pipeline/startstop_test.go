package pipeline_test

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline"
)

// groupCreateConn cancels a context when its client sends XGROUP: Watermill's
// Subscribe creates the consumer group, so the cancel lands inside Watermill's
// start-up pass, between one subscription's Subscribe and the next.
type groupCreateConn struct {
	net.Conn
	cancel func()
}

func (c groupCreateConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToUpper(b), []byte("XGROUP")) {
		c.cancel()
	}
	return c.Conn.Write(b)
}

// A router whose context ends while Watermill subscribes its handlers (a SIGTERM a
// moment after start-up, the demo interrupted early) stops at once and leaves no
// goroutine behind. Watermill fails a Subscribe under an ended context and then counts
// the handler that never started as running: its Close waited CloseTimeout for it,
// and its watcher waited for ever.
func TestRouterCancelledWhileWatermillSubscribesStopsAtOnce(t *testing.T) {
	// Not parallel: it counts goroutines and bounds a latency.
	e := newEnv(t)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	opts := *e.opts
	opts.Dialer = func(dctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(dctx, network, addr)
		if err != nil {
			return nil, err
		}
		return groupCreateConn{Conn: c, cancel: func() { once.Do(cancel) }}, nil
	}
	cfg := e.Config("triage", "", "w1", e.locker(3*time.Second), func(*message.Message) error { return nil })
	cfg.ClientOptions = &opts
	cfg.Concurrency = 2
	cfg.CloseTimeout = 30 * time.Second
	r, err := pipeline.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	runErr := r.Run(ctx)
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Run and Close took %s (CloseTimeout %s; Run: %v): they waited for handlers that never started", took, cfg.CloseTimeout, runErr)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= before },
		"goroutines back to %d (now %d)", before, runtime.NumGoroutine())
}
