package pipeline

import (
	"context"
	"encoding/json"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
)

// Worker presence (event.WorkerBeat): each router renews its subscriptions' members of
// Topology.Workers every event.PresenceInterval, and removes them when it stops.

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
	go func() { done <- r.presence(pctx) }()
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

// presence renews the router's members until ctx ends, and returns them.
func (r *Router) presence(ctx context.Context) []any {
	host, _ := os.Hostname()
	started := time.Now().UnixMilli()
	args := []any{event.PresenceTTL.Milliseconds(), presenceKeep.Milliseconds()}
	var members []any
	for _, s := range r.subs {
		b, _ := json.Marshal(event.WorkerBeat{Consumer: s.consumer, Stream: s.route.Stream, Group: s.route.Group,
			Agent: r.cfg.Agent, Branch: r.cfg.Branch, Host: host, PID: os.Getpid(), Started: started})
		members = append(members, string(b))
	}
	args = append(args, members...)
	key := []string{r.cfg.Topology.Workers()}
	log := r.cfg.Logger.With().Str("key", key[0]).Logger()
	failing := false
	beat := func() {
		cctx, cancel := context.WithTimeout(ctx, event.PresenceInterval)
		defer cancel()
		err := presenceScript.Run(cctx, r.cfg.Client, key, args...).Err()
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
	t := time.NewTicker(event.PresenceInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return members
		case <-t.C:
			beat()
		}
	}
}
