package pipeline

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/presence"
)

// Worker presence (presence.Beat): each router renews its subscriptions' members of
// Topology.Workers every presence.Interval, and removes them when it stops.

// presenceKeep is how long an expired member stays, shown as dead, before it is pruned.
const presenceKeep = time.Hour

// presenceScript renews members (ARGV[3..]) until Redis's now + ARGV[1] ms and prunes
// members expired for more than ARGV[2] ms, in one round trip. The key itself expires
// with the last member, so a namespace without workers leaves nothing behind.
var presenceScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - keep)
redis.call('PEXPIRE', KEYS[1], ttl + keep)
return now
`)

// startPresence renews the router's presence until ctx ends or the returned stop is
// called (when Run returns, also after a Close). stop then removes it: a clean stop is
// gone at once, not in PresenceTTL. The removal waits for Run's end, not ctx's: while
// Watermill winds the subscriptions down, one more command per router only competes with
// their releases and acks (the demo's 14 routers on one embedded Redis stalled on it).
func (r *Router) startPresence(ctx context.Context) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan []any, 1)
	first := make(chan struct{})
	go func() { done <- r.presence(pctx, first) }()
	// The router runs only once its first beat is written (or failed, within
	// presence.Interval): a console asked as soon as it runs lists it.
	<-first
	return func() {
		cancel()
		members := <-done
		cctx, cancelRm := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancelRm()
		if err := r.cfg.Client.ZRem(cctx, r.cfg.Topology.Workers(), members...).Err(); err != nil {
			r.cfg.Logger.Debug().Err(err).Msg("worker presence not removed; it expires")
		}
	}
}

// presence renews the router's members until ctx ends, and returns them; first is
// closed once the first beat is done. Each beat
// first reads the drain requests (drain.go), and a member carries its subscription's
// drain state: when a state changes, the beat replaces the old member (ZREM in the same
// transaction). While a subscription is draining, its state is looked at every
// drainCheck, and the change beats at once, so `drain --wait` hears of it promptly.
func (r *Router) presence(ctx context.Context, first chan<- struct{}) []any {
	host, _ := os.Hostname()
	started := time.Now().UnixMilli()
	key := []string{r.cfg.Topology.Workers()}
	log := r.cfg.Logger.With().Str("key", key[0]).Logger()
	failing := false
	var members []any // as last written
	sig, _ := r.drainSignature()
	beat := func() {
		cctx, cancel := context.WithTimeout(ctx, presence.Interval)
		defer cancel()
		r.pollDrains(cctx)
		sig, _ = r.drainSignature()
		next := r.presenceMembers(host, started)
		err := r.writePresence(cctx, key, members, next)
		if err == nil {
			members = next
		}
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			// Once per outage: the views show this worker as dead meanwhile, and the
			// router's own logs say why Redis is failing.
			failing = true
			log.Warn().Err(err).Msg("worker presence not renewed; the console shows this worker as dead until it is")
		case err == nil && failing:
			failing = false
			log.Info().Msg("worker presence renewed again")
		}
	}
	beat()
	close(first)
	last := time.Now()
	t := time.NewTimer(presence.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return members
		case <-t.C:
		}
		if now, _ := r.drainSignature(); now != sig || time.Since(last) >= presence.Interval {
			beat()
			last = time.Now()
		}
		_, pending := r.drainSignature() // after the beat: it may have just seen a request
		wait := presence.Interval - time.Since(last)
		if pending {
			wait = min(wait, drainCheck)
		}
		t.Reset(max(wait, time.Millisecond))
	}
}

// drainCheck is how often a draining router looks whether its subscriptions are
// drained (in memory: no round trip).
const drainCheck = 100 * time.Millisecond

// presenceMembers is the members of the router's subscriptions, with their drain state.
func (r *Router) presenceMembers(host string, started int64) []any {
	members := make([]any, 0, len(r.subs))
	for _, s := range r.subs {
		state, reason := r.drainState(s)
		b, _ := json.Marshal(presence.Beat{Consumer: s.consumer, Stream: s.route.Stream, Group: s.route.Group,
			Agent: r.cfg.Agent, Branch: r.cfg.Branch, Host: host, PID: os.Getpid(), Started: started,
			Drain: state, DrainReason: reason})
		members = append(members, string(b))
	}
	return members
}

// writePresence renews members next; members old that next no longer has (a drain
// state changed) are removed in the same transaction.
func (r *Router) writePresence(ctx context.Context, key []string, old, next []any) error {
	args := []any{presence.TTL.Milliseconds(), presenceKeep.Milliseconds()}
	args = append(args, next...)
	var stale []any
	for _, m := range old {
		if !slices.Contains(next, m) {
			stale = append(stale, m)
		}
	}
	if len(stale) == 0 {
		return presenceScript.Run(ctx, r.cfg.Client, key, args...).Err()
	}
	pipe := r.cfg.Client.TxPipeline()
	pipe.ZRem(ctx, key[0], stale...)
	presenceScript.Eval(ctx, pipe, key, args...)
	_, err := pipe.Exec(ctx)
	return err
}
