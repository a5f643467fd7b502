package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/internal/metric"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// newLimiter is one process's Limiter on the test's namespace.
func newLimiter(t *testing.T, rdb redis.UniversalClient, ns string, m *ratelimit.Metrics, limits map[string]ratelimit.Rate) *ratelimit.Limiter {
	t.Helper()
	l, err := ratelimit.New(ratelimit.Config{Client: rdb, Prefix: ns + "ratelimit:", Limits: limits, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var jiraRate = map[string]ratelimit.Rate{"jira": {N: 5, Per: time.Second, Burst: 3}}

// An idle budget permits Burst at once, then refuses, and says to come back within one
// interval; a refusal spends nothing.
func TestPermitBurstThenRefuses(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLimiter(t, rdb, ns, nil, map[string]ratelimit.Rate{"jira": {N: 1, Per: time.Hour, Burst: 3}})
	for i := range 3 {
		if ok, _, err := l.Permit(ctx, "jira"); !ok || err != nil {
			t.Fatalf("permit %d of the burst: %v %v", i+1, ok, err)
		}
	}
	for range 3 {
		ok, retry, err := l.Permit(ctx, "jira")
		if ok || err != nil || retry <= 0 || retry > time.Hour {
			t.Fatalf("over the burst: ok %v retry %s err %v; want a refusal within an hour", ok, retry, err)
		}
	}
}

// Two processes (two Limiters on two connections) share one budget.
func TestBudgetSharedBetweenLimiters(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	other := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = other.Close() })
	ctx := context.Background()
	rate := map[string]ratelimit.Rate{"jira": {N: 1, Per: time.Hour, Burst: 2}}
	a, b := newLimiter(t, rdb, ns, nil, rate), newLimiter(t, other, ns, nil, rate)
	for _, l := range []*ratelimit.Limiter{a, b} {
		if ok, _, err := l.Permit(ctx, "jira"); !ok || err != nil {
			t.Fatalf("first permits: %v %v", ok, err)
		}
	}
	if ok, _, _ := a.Permit(ctx, "jira"); ok {
		t.Fatal("a third permit out of a burst of 2 shared by two limiters")
	}
}

// A 429's Throttle pauses the budget for every process, is never shortened by a
// shorter one, is bounded by MaxPause, and ends by itself.
func TestThrottlePausesEveryone(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	m := ratelimit.NewMetrics(metric.NewRegistry())
	a, b := newLimiter(t, rdb, ns, nil, jiraRate), newLimiter(t, rdb, ns, m, jiraRate)
	if err := a.Throttle(ctx, "jira", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := a.Throttle(ctx, "jira", time.Second); err != nil { // shorter: kept at 30 s
		t.Fatal(err)
	}
	ok, retry, err := b.Permit(ctx, "jira")
	if ok || err != nil || retry <= 20*time.Second || retry > 30*time.Second {
		t.Fatalf("during another process's pause: ok %v retry %s err %v; want a refusal for the rest of 30 s", ok, retry, err)
	}
	if n := m.Throttled("jira", "paused"); n != 1 {
		t.Errorf("throttled{reason=paused} = %v, want 1", n)
	}
	// A second question of the same process is answered from what it saw: no round trip.
	rt := &redistest.RoundTrips{}
	rdb.AddHook(rt)
	if ok, _, _ := b.Permit(ctx, "jira"); ok || rt.Count() != 0 {
		t.Errorf("a known pause: ok %v, %d round trips; want a refusal without one", ok, rt.Count())
	}

	// Bounded by MaxPause.
	c, err := ratelimit.New(ratelimit.Config{Client: rdb, Prefix: ns + "capped:", Limits: jiraRate, MaxPause: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Throttle(ctx, "jira", time.Hour); err != nil {
		t.Fatal(err)
	}
	if ms := rdb.PTTL(ctx, c.PauseKey("jira")).Val(); ms > 200*time.Millisecond || ms <= 0 {
		t.Errorf("pause of an hour capped to %s, want at most 200ms", ms)
	}
	// ...and ends by itself: a fresh limiter (another process) is permitted again.
	d := newLimiter(t, rdb, ns+"capped:", nil, jiraRate)
	redistest.Eventually(t, 10*time.Second, func() bool {
		ok, _, err := d.Permit(ctx, "jira")
		return ok && err == nil
	}, "the pause to end")
}

// Wait waits out a pause and a refusal, recording both on the caller's span and in the
// metrics; it does not start a wait its context's deadline would cut short.
func TestWaitRecordsAndHonoursDeadline(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	m := ratelimit.NewMetrics(metric.NewRegistry())
	l := newLimiter(t, rdb, ns, m, map[string]ratelimit.Rate{"jira": {N: 20, Per: time.Second, Burst: 1}})
	ctx := context.Background()
	if err := l.Throttle(ctx, "jira", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	sctx, span := tp.Tracer("test").Start(ctx, "jira request")
	if err := l.Wait(sctx, "jira"); err != nil {
		t.Fatal(err)
	}
	span.End()
	var names []string
	for _, e := range rec.Ended()[0].Events() {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, ","); got != "ratelimit.throttled,ratelimit.permitted" {
		t.Errorf("span events %q", got)
	}
	if n := m.Waits(); n != 1 {
		t.Errorf("wait histogram series = %d, want 1", n)
	}

	if err := l.Throttle(ctx, "jira", time.Minute); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	err := l.Wait(dctx, "jira")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("a wait past the deadline: %v after %s; want DeadlineExceeded at once", err, time.Since(start))
	}
}

func TestUnknownLimitAndBadConfig(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLimiter(t, rdb, ns, nil, jiraRate)
	ctx := context.Background()
	if _, _, err := l.Permit(ctx, "gitlab"); !errors.Is(err, ratelimit.ErrUnknownLimit) {
		t.Errorf("Permit of an unknown name: %v", err)
	}
	if err := l.Throttle(ctx, "gitlab", time.Second); !errors.Is(err, ratelimit.ErrUnknownLimit) {
		t.Errorf("Throttle of an unknown name: %v", err)
	}
	if _, err := l.Budget("gitlab"); !errors.Is(err, ratelimit.ErrUnknownLimit) {
		t.Errorf("Budget of an unknown name: %v", err)
	}
	for _, c := range []struct {
		cfg  ratelimit.Config
		want string
	}{
		{ratelimit.Config{Limits: jiraRate}, "Client"},
		{ratelimit.Config{Client: rdb}, "at least one"},
		{ratelimit.Config{Client: rdb, Limits: map[string]ratelimit.Rate{"jira": {N: 0, Per: time.Second, Burst: 1}}}, "Limits[jira]"},
		{ratelimit.Config{Client: rdb, Limits: map[string]ratelimit.Rate{"a b": {N: 1, Per: time.Second, Burst: 1}}}, "bad name"},
		{ratelimit.Config{Client: rdb, Limits: jiraRate, MaxPause: -time.Second}, "MaxPause"},
	} {
		if _, err := ratelimit.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}

// slowHook delays every command of a client: a busier process, whose requests land a
// little after everyone else's.
type slowHook struct{ d time.Duration }

func (slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { time.Sleep(h.d); return next(ctx, cmd) }
}
func (h slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { time.Sleep(h.d); return next(ctx, cmds) }
}

// Waiters are served in the order they asked: of two processes sharing 10/s, the one
// whose requests land 10 ms after the other's still gets about half. Were each to ask
// again when told (poll), the prompt one would take every slot.
func TestWaitServesInTurn(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	slow := redis.NewClient(rdb.Options())
	slow.AddHook(slowHook{10 * time.Millisecond})
	t.Cleanup(func() { _ = slow.Close() })
	rate := map[string]ratelimit.Rate{"jira": {N: 10, Per: time.Second, Burst: 1}}
	ls := []*ratelimit.Limiter{newLimiter(t, rdb, ns, nil, rate), newLimiter(t, slow, ns, nil, rate)}
	grants := make([]int, len(ls))
	var wg sync.WaitGroup
	start := time.Now()
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 3*time.Second {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := l.Wait(ctx, "jira")
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				grants[i]++
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
		t.Errorf("grants %v: the process 10 ms slower got %d of %d, want about half", grants, grants[1], total)
	}
}

// A pause that begins while a waiter waits for its booked slot is honoured: the slot
// is not used, and the waiter goes after the pause. The pause refused it once, and is
// counted once.
func TestWaitHonoursAPauseThatBeginsWhileBooked(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	m := ratelimit.NewMetrics(metric.NewRegistry())
	l := newLimiter(t, rdb, ns, m, map[string]ratelimit.Rate{"jira": {N: 1, Per: time.Second, Burst: 1}})
	ctx := context.Background()
	if err := l.Wait(ctx, "jira"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx, "jira") }() // books the slot a second from now
	time.Sleep(200 * time.Millisecond)
	if err := rdb.Set(ctx, l.PauseKey("jira"), "429", 2*time.Second).Err(); err != nil { // another process's Throttle
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("permitted %s after it began to wait, within a pause that began at 200 ms and lasted 2 s", took)
	}
	if n := m.Throttled("jira", "paused"); n != 1 {
		t.Errorf("throttled{reason=paused} = %v after one wait that met one pause, want 1", n)
	}
}
