package pipeline_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Issue 29: one process per consumer name. A live process's claim is refused (at once on
// this host, after seeing it refreshed from another); a dead process's is taken over (at
// once on this host, once expired from another); Release frees the name at once.
func TestClaimConsumer(t *testing.T) {
	// Not parallel: the consumer-name claim is a TTL'd key kept by a heartbeat; its expiry is what the test times.
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	topo := event.Topology{Namespace: ns + "ymir"}
	key := topo.ConsumerClaimKey("triage", "w1")
	host, _ := os.Hostname()
	log := zerolog.Nop()
	const ttl = 600 * time.Millisecond

	// A live process of this host (our parent) holds it: refused at once.
	rdb.Set(ctx, key, host+" "+strconv.Itoa(os.Getppid())+" tok", time.Minute)
	start := time.Now()
	_, err := pipeline.ClaimConsumer(ctx, rdb, topo, "triage", "w1", ttl, log)
	if !errors.Is(err, pipeline.ErrConsumerInUse) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getppid())) {
		t.Fatalf("live pid on this host: %v", err)
	}
	if took := time.Since(start); took > ttl/2 {
		t.Errorf("live pid on this host: refused after %v, want at once", took)
	}

	// A process of this host that is gone: taken over at once.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	rdb.Set(ctx, key, host+" "+strconv.Itoa(dead.Process.Pid)+" tok", time.Minute)
	c, err := pipeline.ClaimConsumer(ctx, rdb, topo, "triage", "w1", ttl, log)
	if err != nil {
		t.Fatalf("dead pid on this host: %v", err)
	}
	if v := rdb.Get(ctx, key).Val(); !strings.HasPrefix(v, host+" "+strconv.Itoa(os.Getpid())+" ") {
		t.Fatalf("claim after the takeover: %q", v)
	}
	// It is refreshed while held: still there after several TTLs.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if rdb.Exists(ctx, key).Val() != 1 {
			t.Fatal("the claim expired while held")
		}
		time.Sleep(ttl / 6) // sampling the key's life, not waiting for a condition
	}
	c.Release(ctx)
	if rdb.Exists(ctx, key).Val() != 0 {
		t.Fatal("Release left the claim")
	}

	// Another host's claim that is refreshed: refused once a refresh is seen.
	rdb.Set(ctx, key, "elsewhere 1 tok", ttl)
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(ttl / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				rdb.PExpire(ctx, key, ttl)
			}
		}
	}()
	start = time.Now()
	_, err = pipeline.ClaimConsumer(ctx, rdb, topo, "triage", "w1", ttl, log)
	if !errors.Is(err, pipeline.ErrConsumerInUse) || !strings.Contains(err.Error(), "host elsewhere") {
		t.Fatalf("refreshed claim of another host: %v", err)
	}
	if took := time.Since(start); took > 2*ttl {
		t.Errorf("refreshed claim of another host: refused after %v", took)
	}

	close(stop)

	// Another host's claim left to expire: taken once it has.
	rdb.Set(ctx, key, "elsewhere 1 tok", ttl/2)
	other := event.Topology{Namespace: topo.Namespace}
	c, err = pipeline.ClaimConsumer(ctx, rdb, other, "triage", "w1", ttl, log)
	if err != nil {
		t.Fatalf("expiring claim of another host: %v", err)
	}
	c.Release(ctx)
}
