package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// ErrUnknownLimit is returned for a name the Limiter has no Rate for.
var ErrUnknownLimit = errors.New("ratelimit: no limit of that name")

// DefaultMaxPause bounds a pause Throttle sets: an upstream's Retry-After of an hour
// would otherwise stop every process for an hour on one answer.
const DefaultMaxPause = 5 * time.Minute

// Config configures New. Client and Limits are required.
type Config struct {
	// Client is the Redis every process of the pipeline shares. Required.
	Client redis.UniversalClient
	// Prefix is put before every key, e.g. "ymir:ratelimit:" (the pipeline's namespace).
	// Default: "ratelimit:".
	Prefix string
	// Limits are the budgets by name ("jira", "run:rebase", "llm"). Each must pass
	// Rate.Check. Required, at least one.
	Limits map[string]Rate
	// MaxPause bounds a pause set by Throttle. Default: DefaultMaxPause, 5 minutes.
	MaxPause time.Duration
	// Metrics counts refusals, waits and pauses. Default: nil, nothing counted.
	Metrics *Metrics
}

// Limiter hands out the permits of named budgets shared through Redis. It is safe for
// concurrent use; every process that builds one with the same Prefix and Limits shares
// the budgets.
type Limiter struct {
	rdb      redis.UniversalClient
	gcra     *redis_rate.Limiter
	prefix   string
	limits   map[string]redis_rate.Limit
	rates    map[string]Rate
	maxPause time.Duration
	metrics  *Metrics

	mu     sync.Mutex
	paused map[string]time.Time // a pause seen, by name: no need to ask Redis before then
}

// New checks cfg and returns a Limiter. It does no I/O.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, errors.New("ratelimit: Config.Client is required")
	}
	if len(cfg.Limits) == 0 {
		return nil, errors.New("ratelimit: Config.Limits: at least one limit is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "ratelimit:"
	}
	switch {
	case cfg.MaxPause < 0:
		return nil, fmt.Errorf("ratelimit: Config.MaxPause must not be negative, got %s", cfg.MaxPause)
	case cfg.MaxPause == 0:
		cfg.MaxPause = DefaultMaxPause
	}
	l := &Limiter{rdb: cfg.Client, gcra: redis_rate.NewLimiter(cfg.Client), prefix: cfg.Prefix,
		limits: map[string]redis_rate.Limit{}, rates: map[string]Rate{}, maxPause: cfg.MaxPause,
		metrics: cfg.Metrics, paused: map[string]time.Time{}}
	for name, r := range cfg.Limits {
		if name == "" || strings.ContainsAny(name, " \t\r\n{}*?[]") {
			return nil, fmt.Errorf("ratelimit: Config.Limits: bad name %q (no spaces, braces or glob characters)", name)
		}
		if err := r.Check(); err != nil {
			return nil, fmt.Errorf("ratelimit: Config.Limits[%s]: %w", name, err)
		}
		l.rates[name] = r
		l.limits[name] = redis_rate.Limit{Rate: r.N, Period: r.Per, Burst: r.Burst}
	}
	return l, nil
}

// Names are the limits' names, sorted.
func (l *Limiter) Names() []string {
	out := make([]string, 0, len(l.rates))
	for n := range l.rates {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Rate is the rate of the named limit.
func (l *Limiter) Rate(name string) (Rate, bool) {
	r, ok := l.rates[name]
	return r, ok
}

// PauseKey is the key of name's pause, for tests and operators.
func (l *Limiter) PauseKey(name string) string { return l.prefix + name + ":pause" }

// RateKey is the key of name's GCRA state (redis_rate puts "rate:" in front).
func (l *Limiter) RateKey(name string) string { return "rate:" + l.prefix + name }

// Permit asks for one event of the named budget now. ok: go ahead (the event is
// counted). Otherwise retryAfter says when to ask again: the rest of a pause set by
// Throttle, or GCRA's wait for the next free slot; a refusal spends nothing. err is a
// Redis failure (wrapped) or ErrUnknownLimit, with ok false.
func (l *Limiter) Permit(ctx context.Context, name string) (ok bool, retryAfter time.Duration, err error) {
	ok, retryAfter, _, err = l.permit(ctx, name)
	return ok, retryAfter, err
}

// reason of a refusal, for metrics and spans.
const (
	reasonRate   = "rate"
	reasonPaused = "paused"
)

func (l *Limiter) permit(ctx context.Context, name string) (bool, time.Duration, string, error) {
	limit, known := l.limits[name]
	if !known {
		return false, 0, "", fmt.Errorf("%w: %q", ErrUnknownLimit, name)
	}
	if paused, err := l.pause(ctx, name); err != nil || paused > 0 {
		return false, paused, reasonPaused, err
	}
	res, err := l.gcra.Allow(ctx, l.prefix+name, limit)
	if err != nil {
		return false, 0, "", fmt.Errorf("ratelimit: %s: ask the rate limiter: %w", name, err)
	}
	if res.Allowed > 0 {
		l.metrics.permitted(name)
		return true, 0, "", nil
	}
	l.metrics.throttled(name, reasonRate)
	// RetryAfter is -1 only when allowed; a refusal always waits something.
	return false, max(res.RetryAfter, time.Millisecond), reasonRate, nil
}

// Throttle pauses the named budget for every process for retryAfter (at most
// Config.MaxPause), as an upstream's 429 with Retry-After asks: until then Permit
// refuses everyone. A longer pause already set is kept. A retryAfter of zero or less
// does nothing.
func (l *Limiter) Throttle(ctx context.Context, name string, retryAfter time.Duration) error {
	if _, known := l.limits[name]; !known {
		return fmt.Errorf("%w: %q", ErrUnknownLimit, name)
	}
	if retryAfter <= 0 {
		return nil
	}
	retryAfter = min(retryAfter, l.maxPause)
	ms := max(retryAfter.Milliseconds(), 1)
	left, err := pauseScript.Run(ctx, l.rdb, []string{l.PauseKey(name)}, ms, "throttled").Int64()
	if err != nil {
		return fmt.Errorf("ratelimit: %s: pause for %s: %w", name, retryAfter, err)
	}
	l.notePause(name, time.Duration(left)*time.Millisecond)
	l.metrics.paused(name)
	trace.SpanFromContext(ctx).AddEvent("ratelimit.paused", trace.WithAttributes(
		attrLimit.String(name), attrRetryAfter.Int64(left)))
	return nil
}

// Wait blocks until an event of the named budget is permitted, or ctx ends (its error,
// wrapped), or Redis fails. It books its slot (reserve.lua) rather than asking again
// and again, so that the waiters of every process are served in the order they asked:
// one that wakes a little late (a busier process) is not passed over each time by one
// that wakes first. A pause (Throttle) is waited out first, and again if one begins
// while it waits for its slot (that slot is then not used). It does not start a wait
// that would outlast ctx's deadline: it returns context.DeadlineExceeded at once
// instead (booking nothing).
func (l *Limiter) Wait(ctx context.Context, name string) error {
	var start time.Time
	for {
		wait, booked, reason, err := l.book(ctx, name)
		if err != nil {
			return err
		}
		if booked && wait <= 0 {
			l.granted(ctx, name, start)
			return nil
		}
		if start.IsZero() {
			start = time.Now()
			trace.SpanFromContext(ctx).AddEvent("ratelimit.throttled", trace.WithAttributes(
				attrLimit.String(name), attrReason.String(reason), attrRetryAfter.Int64(wait.Milliseconds())))
		}
		if err := sleep(ctx, wait); err != nil {
			l.metrics.waited(name, time.Since(start))
			return fmt.Errorf("ratelimit: %s: waiting %s for a permit: %w", name, wait, err)
		}
		if !booked {
			continue
		}
		// The slot is ours, unless a 429 paused the budget in the meantime. The pause
		// is counted once, by the book that follows, not here.
		if paused, err := l.pauseLeft(ctx, name); err != nil {
			return err
		} else if paused == 0 {
			l.granted(ctx, name, start)
			return nil
		}
	}
}

// book books name's next free slot for Wait: the wait until it (0: now) and booked;
// or, not booked, how long until asking again and why (reasonPaused, or reasonRate:
// the slot is further than ctx's deadline allows).
func (l *Limiter) book(ctx context.Context, name string) (time.Duration, bool, string, error) {
	limit, known := l.limits[name]
	if !known {
		return 0, false, "", fmt.Errorf("%w: %q", ErrUnknownLimit, name)
	}
	if paused, err := l.pause(ctx, name); err != nil || paused > 0 {
		return paused, false, reasonPaused, err
	}
	most := maxBooking
	if dl, ok := ctx.Deadline(); ok {
		most = min(most, time.Until(dl))
	}
	res, err := reserveScript.Run(ctx, l.rdb, []string{l.RateKey(name)}, limit.Burst, limit.Rate, limit.Period.Seconds(),
		max(most, 0).Seconds()).Slice()
	if err != nil {
		return 0, false, "", fmt.Errorf("ratelimit: %s: book a permit: %w", name, err)
	}
	if len(res) < 2 {
		return 0, false, "", fmt.Errorf("ratelimit: %s: book a permit: unexpected reply %v", name, res)
	}
	s, _ := res[1].(string)
	secs, _ := strconv.ParseFloat(s, 64)
	wait := time.Duration(secs * float64(time.Second))
	if n, _ := res[0].(int64); n != 1 {
		l.metrics.throttled(name, reasonRate)
		return max(wait-most, time.Millisecond), false, reasonRate, nil
	}
	if wait > 0 {
		l.metrics.throttled(name, reasonRate)
	}
	return wait, true, "", nil
}

// maxBooking is the furthest slot Wait books: past it, it asks again later.
const maxBooking = time.Minute

// pause is what is left of a pause of name (0: none), as Permit reads it; a pause is a
// refusal, counted.
func (l *Limiter) pause(ctx context.Context, name string) (time.Duration, error) {
	left, err := l.pauseLeft(ctx, name)
	if left > 0 {
		l.metrics.throttled(name, reasonPaused)
	}
	return left, err
}

// pauseLeft is what is left of a pause of name (0: none): from what this process saw,
// else from Redis.
func (l *Limiter) pauseLeft(ctx context.Context, name string) (time.Duration, error) {
	if left := l.pausedFor(name); left > 0 {
		return left, nil
	}
	pttl, err := l.rdb.PTTL(ctx, l.PauseKey(name)).Result()
	if err != nil {
		return 0, fmt.Errorf("ratelimit: %s: read the pause: %w", name, err)
	}
	if pttl > 0 {
		l.notePause(name, pttl)
		return pttl, nil
	}
	return 0, nil
}

// granted records a permit Wait got, and how long it waited for it (start: when it
// began to wait; zero if it did not).
func (l *Limiter) granted(ctx context.Context, name string, start time.Time) {
	l.metrics.permitted(name)
	if start.IsZero() {
		return
	}
	waited := time.Since(start)
	l.metrics.waited(name, waited)
	trace.SpanFromContext(ctx).AddEvent("ratelimit.permitted", trace.WithAttributes(
		attrLimit.String(name), attrWaited.Int64(waited.Milliseconds())))
}

//go:embed scripts/reserve.lua
var reserveLua string

var reserveScript = redis.NewScript(reserveLua)

// Budget is one named budget of a Limiter, for a client that spends it (internal/jira's
// Options.Shared).
type Budget struct {
	l    *Limiter
	name string
}

// Budget returns the named budget, or ErrUnknownLimit.
func (l *Limiter) Budget(name string) (*Budget, error) {
	if _, known := l.limits[name]; !known {
		return nil, fmt.Errorf("%w: %q", ErrUnknownLimit, name)
	}
	return &Budget{l: l, name: name}, nil
}

// Name is the budget's name.
func (b *Budget) Name() string { return b.name }

// Wait is Limiter.Wait for this budget.
func (b *Budget) Wait(ctx context.Context) error { return b.l.Wait(ctx, b.name) }

// Permit is Limiter.Permit for this budget.
func (b *Budget) Permit(ctx context.Context) (bool, time.Duration, error) {
	return b.l.Permit(ctx, b.name)
}

// Throttle is Limiter.Throttle for this budget.
func (b *Budget) Throttle(ctx context.Context, retryAfter time.Duration) error {
	return b.l.Throttle(ctx, b.name, retryAfter)
}

// pausedFor is how much is left of a pause this process saw for name.
func (l *Limiter) pausedFor(name string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Until(l.paused[name])
}

// notePause remembers a pause of d from now, so the waiters of this process do not ask
// Redis again before it ends.
func (l *Limiter) notePause(name string, d time.Duration) {
	until := time.Now().Add(d)
	l.mu.Lock()
	defer l.mu.Unlock()
	if until.After(l.paused[name]) {
		l.paused[name] = until
	}
}

//go:embed scripts/pause.lua
var pauseLua string

var pauseScript = redis.NewScript(pauseLua)

// errDeadlineTooSoon is returned instead of sleeping past the context's deadline.
var errDeadlineTooSoon = fmt.Errorf("the wait would outlast the context deadline: %w", context.DeadlineExceeded)

// sleep sleeps for d, or returns early with ctx's cause; it does not start a sleep
// that would end after ctx's deadline.
func sleep(ctx context.Context, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return errDeadlineTooSoon
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// Span attributes of the ratelimit.* events.
var (
	attrLimit      = attribute.Key("ratelimit.limit")
	attrReason     = attribute.Key("ratelimit.reason")
	attrRetryAfter = attribute.Key("ratelimit.retry_after_ms")
	attrWaited     = attribute.Key("ratelimit.waited_ms")
)
