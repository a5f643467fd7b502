package integration

import (
	"context"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// TestLeaseSurvivesARedisBlipOfHalfItsTTL: the lease promises "Redis blips shorter than the
// TTL never cancel work". Redis (AOF) is down for TTL/2, starting just before the lease's
// second heartbeat: the key is still alive on the server when Redis is back (last extend at
// TTL/3, expiry at 4/3 TTL), and the holder may extend it until TTL/3 + TTL - TTL/10. The
// lease must survive.
func TestLeaseSurvivesARedisBlipOfHalfItsTTL(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rdb, err := pipeline.NewClient(srv.URL()) // the workers' client options
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ttl := 6 * time.Second // seconds: a restart of redis-server on a busy machine takes a few hundred ms of the window
	locker, err := lease.New(rdb, lease.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	le, err := locker.Acquire(context.Background(), "triage", "RHEL-1", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	t0 := le.AcquiredAt()
	// The point: the outage is timed against the heartbeats (see above).
	time.Sleep(time.Until(t0.Add(2*ttl/3 - 100*time.Millisecond)))
	down := time.Now()
	srv.Stop()
	time.Sleep(ttl / 2)
	srv.Start()
	back := time.Since(t0)
	time.Sleep(time.Until(t0.Add(2 * ttl)))
	t.Logf("Redis down from %s to %s after the acquire (TTL %s, heartbeat every %s)", down.Sub(t0).Round(time.Millisecond),
		back.Round(time.Millisecond), ttl, ttl/3)
	if err := le.Err(); err != nil {
		t.Fatalf("the lease was given up after a Redis blip of %s (TTL %s), though the key was alive on the server "+
			"when Redis came back at %s: %v", ttl/2, ttl, back.Round(time.Millisecond), err)
	}
	if got := rdb.Get(context.Background(), le.Keys().Lock).Val(); got != le.Token() {
		t.Fatalf("lease key holds %q, want our token", got)
	}
}
