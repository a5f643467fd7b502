package agentctl

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Permits limits the calls to named upstreams (jira, gitlab, llm:<model>) for every
// pod at once. Small on purpose: the flow-control limiter of another package can stand
// behind it.
type Permits interface {
	// Allow takes one permit for upstream: 0 when granted, else how long to wait.
	Allow(ctx context.Context, upstream string) (time.Duration, error)
	// Throttle reports a 429 from upstream with its Retry-After: every pod waits that
	// long, then runs at half the rate for ShrinkFor.
	Throttle(ctx context.Context, upstream string, retryAfter time.Duration) error
}

// Rate is one upstream's limit: PerSecond calls a second, Burst at once (default 1).
type Rate struct {
	PerSecond int
	Burst     int
}

// ShrinkFor is how long an upstream runs at half its rate after a reported 429.
const ShrinkFor = time.Minute

// RedisPermits is Permits on Redis with GCRA (github.com/go-redis/redis_rate). An
// upstream without a Rate is not limited.
type RedisPermits struct {
	rdb     redis.UniversalClient
	limiter *redis_rate.Limiter
	prefix  string
	rates   map[string]Rate
}

// NewRedisPermits returns the limiter of rates under prefix (e.g. "ymir:").
func NewRedisPermits(rdb redis.UniversalClient, prefix string, rates map[string]Rate) (*RedisPermits, error) {
	for name, r := range rates {
		if !upstreamRe.MatchString(name) || r.PerSecond < 1 || r.Burst < 0 {
			return nil, fmt.Errorf("agentctl: permit %q: want jira, gitlab or llm:<model> at 1 or more a second", name)
		}
	}
	return &RedisPermits{rdb: rdb, limiter: redis_rate.NewLimiter(rdb), prefix: prefix + "ctl:permit:", rates: rates}, nil
}

func (p *RedisPermits) holdKey(upstream string) string   { return p.prefix + "hold:" + upstream }
func (p *RedisPermits) shrinkKey(upstream string) string { return p.prefix + "shrink:" + upstream }

// Allow implements Permits.
func (p *RedisPermits) Allow(ctx context.Context, upstream string) (time.Duration, error) {
	r, ok := p.rates[upstream]
	if !ok {
		return 0, nil
	}
	pipe := p.rdb.Pipeline()
	hold := pipe.PTTL(ctx, p.holdKey(upstream))
	shrunk := pipe.Exists(ctx, p.shrinkKey(upstream))
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("agentctl: permit %s: %w", upstream, err)
	}
	if d := hold.Val(); d > 0 {
		return d, nil
	}
	lim := redis_rate.Limit{Rate: r.PerSecond, Burst: max(r.Burst, 1), Period: time.Second}
	key := p.prefix + upstream // redis_rate adds its own "rate:" before it
	if shrunk.Val() > 0 {
		// Half the rate: the same GCRA key with a period twice as long.
		lim.Period = 2 * time.Second
	}
	res, err := p.limiter.Allow(ctx, key, lim)
	if err != nil {
		return 0, fmt.Errorf("agentctl: permit %s: %w", upstream, err)
	}
	if res.Allowed > 0 {
		return 0, nil
	}
	return max(res.RetryAfter, time.Millisecond), nil
}

// Throttle implements Permits.
func (p *RedisPermits) Throttle(ctx context.Context, upstream string, retryAfter time.Duration) error {
	if _, ok := p.rates[upstream]; !ok {
		return nil
	}
	retryAfter = min(max(retryAfter, time.Second), time.Hour)
	pipe := p.rdb.Pipeline()
	// The latest report sets the hold: a 429 says how long from now.
	pipe.Set(ctx, p.holdKey(upstream), "1", retryAfter)
	pipe.Set(ctx, p.shrinkKey(upstream), "1", retryAfter+ShrinkFor)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("agentctl: throttle %s: %w", upstream, err)
	}
	return nil
}
