package agentctl

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Permits limits the calls to named upstreams (jira, gitlab, llm:<model>) for every
// pod at once. Small on purpose: the flow-control limiter of another package can stand
// behind it.
type Permits interface {
	// Allow takes one permit for upstream, waiting for it when its turn is near: 0
	// when granted, else how long to wait before asking again.
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

// MaxPermitWait is the longest Allow waits for a permit it has booked: when more
// than that many permits are booked before it, it books none and tells the caller
// to ask again later.
const MaxPermitWait = 10 * time.Second

//go:embed scripts/permit.lua
var permitLua string

var permitScript = redis.NewScript(permitLua)

// RedisPermits is Permits on Redis: GCRA with reservation. Each Allow books the next
// free slot of the upstream's rate, across every pod, and waits for it, so callers are
// served in the order they asked: an agent that comes back a little later than the
// others (a slower process, a busier machine) is not passed over again and again, as
// it would be if every caller polled for the next free slot. An upstream without a
// Rate is not limited. Its script reads three keys of an upstream (the state, the
// pause, the half rate), so it needs one Redis (or Sentinel), like the rest of the
// control channel: not Cluster.
type RedisPermits struct {
	rdb    redis.UniversalClient
	prefix string
	rates  map[string]Rate
}

// NewRedisPermits returns the limiter of rates under prefix (e.g. "ymir:").
func NewRedisPermits(rdb redis.UniversalClient, prefix string, rates map[string]Rate) (*RedisPermits, error) {
	for name, r := range rates {
		if !validUpstream(name) || r.PerSecond < 1 || r.Burst < 0 {
			return nil, fmt.Errorf("agentctl: permit %q: want jira, gitlab or llm:<model> at 1 or more a second", name)
		}
	}
	return &RedisPermits{rdb: rdb, prefix: prefix + "ctl:permit:", rates: rates}, nil
}

func (p *RedisPermits) tatKey(upstream string) string    { return p.prefix + "tat:" + upstream }
func (p *RedisPermits) holdKey(upstream string) string   { return p.prefix + "hold:" + upstream }
func (p *RedisPermits) shrinkKey(upstream string) string { return p.prefix + "shrink:" + upstream }

// Allow implements Permits: it books the upstream's next free slot and waits for it
// (at most MaxPermitWait; ctx ending first gives the slot up, unused). A slot booked
// before a 429 was reported is not used: the caller is told to ask again, under the
// pause and the half rate.
func (p *RedisPermits) Allow(ctx context.Context, upstream string) (time.Duration, error) {
	r, ok := p.rates[upstream]
	if !ok {
		return 0, nil
	}
	// The interval in whole microseconds, rounded up: never above the rate.
	interval := (int64(time.Second/time.Microsecond) + int64(r.PerSecond) - 1) / int64(r.PerSecond)
	keys := []string{p.tatKey(upstream), p.holdKey(upstream), p.shrinkKey(upstream)}
	res, err := permitScript.Run(ctx, p.rdb, keys, interval, max(r.Burst, 1), MaxPermitWait.Microseconds()).Slice()
	if err != nil {
		return 0, fmt.Errorf("agentctl: permit %s: %w", upstream, err)
	}
	if len(res) < 2 {
		return 0, fmt.Errorf("agentctl: permit %s: unexpected reply %v", upstream, res)
	}
	wait := time.Duration(toInt(res[1])) * time.Microsecond
	if toInt(res[0]) != 1 {
		return max(wait, time.Millisecond), nil
	}
	if wait <= 0 {
		return 0, nil
	}
	var epoch string
	if len(res) > 2 {
		epoch, _ = res[2].(string)
	}
	return p.await(ctx, upstream, wait, epoch)
}

// await waits for a booked slot, then checks that no 429 was reported since it was
// booked (the shrink key's value is the latest 429's): 0 when the permit is the
// caller's, else how long to wait before asking again.
func (p *RedisPermits) await(ctx context.Context, upstream string, wait time.Duration, epoch string) (time.Duration, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return 0, fmt.Errorf("agentctl: permit %s: %w", upstream, context.Cause(ctx))
	case <-t.C:
	}
	pipe := p.rdb.Pipeline()
	hold := pipe.PTTL(ctx, p.holdKey(upstream))
	now := pipe.Get(ctx, p.shrinkKey(upstream))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("agentctl: permit %s: %w", upstream, err)
	}
	if d := hold.Val(); d > 0 {
		return d, nil
	}
	if now.Val() != epoch {
		return time.Millisecond, nil // a 429 came in between: book again, at half the rate
	}
	return 0, nil
}

func toInt(v any) int64 {
	n, _ := v.(int64)
	return n
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
	// The shrink key's value names this report: a slot booked before it is not used.
	pipe.Set(ctx, p.shrinkKey(upstream), strconv.FormatInt(time.Now().UnixNano(), 36), retryAfter+ShrinkFor)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("agentctl: throttle %s: %w", upstream, err)
	}
	return nil
}
