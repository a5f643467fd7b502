package agentctl_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// hammer asks for permits of upstream from every limiter at once for d and returns
// the grants and the time it took.
func hammer(ctx context.Context, ps []*agentctl.RedisPermits, upstream string, d time.Duration) (int64, time.Duration) {
	var grants atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d {
				wait, err := p.Allow(ctx, upstream)
				if err != nil {
					return
				}
				if wait == 0 {
					grants.Add(1)
					continue
				}
				time.Sleep(min(wait, 20*time.Millisecond))
			}
		}()
	}
	wg.Wait()
	return grants.Load(), time.Since(start)
}

// workerPermits is one worker's limiter of llm:x at rate, on a Redis connection of
// its own.
func workerPermits(t *testing.T, ns string, rate agentctl.Rate) *agentctl.RedisPermits {
	t.Helper()
	opts, _ := redis.ParseURL(redistest.URL())
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	p, err := agentctl.NewRedisPermits(c, ns, map[string]agentctl.Rate{"llm:x": rate})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Limiters of three workers (each its own Redis connection) asking for llm:x limited to
// 5/s stay within it combined; a 429 reported through one pauses all of them, then
// halves their rate.
func TestPermitsSharedAndShrinkOn429(t *testing.T) {
	ctx := context.Background()
	_, ns := redistest.Client(t)
	var ps []*agentctl.RedisPermits
	for range 3 {
		ps = append(ps, workerPermits(t, ns, agentctl.Rate{PerSecond: 5, Burst: 1}))
	}
	grants, took := hammer(ctx, ps, "llm:x", 1500*time.Millisecond)
	if limit := int64(5*took.Seconds()) + 2; grants > limit || grants < 3 {
		t.Fatalf("%d permits in %s from three limiters, want at most %d (5/s combined) and some", grants, took, limit)
	}
	if wait, _ := ps[0].Allow(ctx, "jira"); wait != 0 {
		t.Fatal("an upstream without a rate was limited")
	}

	if err := ps[1].Throttle(ctx, "llm:x", time.Second); err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		if wait, err := p.Allow(ctx, "llm:x"); err != nil || wait <= 0 {
			t.Fatalf("limiter %d right after a 429: wait %s (%v), want a pause", i, wait, err)
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool { w, _ := ps[0].Allow(ctx, "llm:x"); return w == 0 }, "the pause ends")
	grants, took = hammer(ctx, ps, "llm:x", 2*time.Second)
	if limit := int64(2.5*took.Seconds()) + 2; grants > limit {
		t.Fatalf("%d permits in %s after a 429, want at most %d (half the rate)", grants, took, limit)
	}
}

func TestPermitsRefuseBadNames(t *testing.T) {
	for _, name := range []string{"redis", "llm:", "llm:a b", ""} {
		if _, err := agentctl.NewRedisPermits(nil, "", map[string]agentctl.Rate{name: {PerSecond: 1}}); err == nil {
			t.Errorf("%q accepted", name)
		}
	}
	if _, err := agentctl.NewRedisPermits(nil, "", map[string]agentctl.Rate{"jira": {PerSecond: 0}}); err == nil {
		t.Error("a rate of 0 accepted")
	}
}

// Agents are served in the order they asked: of two sharing 10/s, one that comes back
// 30 ms after the other each time (a slower process, a busier machine) still gets its
// half. Were each caller to poll for the next free slot, the prompt one would take
// every slot and the slower one none.
func TestPermitsServeInTurn(t *testing.T) {
	ctx := context.Background()
	_, ns := redistest.Client(t)
	lags := []time.Duration{0, 30 * time.Millisecond}
	grants := make([]int, len(lags))
	var wg sync.WaitGroup
	start := time.Now()
	for i, lag := range lags {
		p := workerPermits(t, ns, agentctl.Rate{PerSecond: 10, Burst: 1})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 3*time.Second {
				wait, err := p.Allow(ctx, "llm:x")
				if err != nil {
					t.Error(err)
					return
				}
				if wait == 0 {
					grants[i]++
				}
				time.Sleep(wait + lag)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	total := grants[0] + grants[1]
	if limit := int(10*took.Seconds()) + 2; total > limit || total < 15 {
		t.Fatalf("%v permits in %s, want at most %d (10/s) and most of them", grants, took, limit)
	}
	if grants[1] < total/3 {
		t.Errorf("grants %v: the agent 30 ms slower got %d of %d, want about half", grants, grants[1], total)
	}
}

// A slot booked before a 429 is not used: its caller is told to wait (the pause), not
// granted in the middle of it. And no caller is made to wait more than MaxPermitWait:
// past it, none is booked and the caller is told when to ask again.
func TestPermitBookedBefore429AndHorizon(t *testing.T) {
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	p, err := agentctl.NewRedisPermits(rdb, ns, map[string]agentctl.Rate{"llm:x": {PerSecond: 1}, "llm:y": {PerSecond: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if wait, err := p.Allow(ctx, "llm:x"); wait != 0 || err != nil {
		t.Fatalf("first permit: wait %s, %v", wait, err)
	}
	got := make(chan time.Duration, 1)
	go func() {
		wait, err := p.Allow(ctx, "llm:x") // books the slot a second from now
		if err != nil {
			t.Error(err)
		}
		got <- wait
	}()
	time.Sleep(200 * time.Millisecond)
	if err := p.Throttle(ctx, "llm:x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if wait := <-got; wait < time.Second {
		t.Errorf("a slot booked before the 429, a second later: wait %s, want the rest of the 2 s pause", wait)
	}

	// llm:y at 1/s: book MaxPermitWait's worth (each caller gives up its slot at once).
	for i := 0; i <= int(agentctl.MaxPermitWait/time.Second); i++ {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, _ = p.Allow(cctx, "llm:y")
		cancel()
	}
	start := time.Now()
	wait, err := p.Allow(ctx, "llm:y")
	if err != nil || wait <= 0 || time.Since(start) > time.Second {
		t.Errorf("past %s of booked permits: wait %s (%v) after %s, want a wait at once", agentctl.MaxPermitWait, wait, err, time.Since(start))
	}
}
