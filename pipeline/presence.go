package pipeline

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Worker presence: each router says, every PresenceInterval, which consumers it reads as,
// so that the operator's views can tell a live idle worker from a dead one and show a new
// worker before its first entry. XINFO CONSUMERS cannot: a consumer's idle time grows the
// same whether it waits on an empty stream or died, and a consumer exists only once it
// has read.
//
// The record is one sorted set per namespace (Topology.Workers): a member per
// subscription, the JSON of a WorkerBeat, scored with the time (ms, Redis's clock) until
// which the beat vouches for it. Redis's clock, not the worker's, so that the console on
// another host compares like with like. A router that stops cleanly removes its members;
// one that dies leaves them to expire (and to be pruned an hour later).
const (
	// PresenceInterval is how often a router renews its presence.
	PresenceInterval = 2 * time.Second
	// PresenceTTL is how long one beat vouches for a worker: several intervals, so a
	// slow round trip or a GC pause does not make a live worker look dead.
	PresenceTTL = 5 * PresenceInterval
	// presenceKeep is how long an expired member stays, shown as dead, before it is
	// pruned.
	presenceKeep = time.Hour
)

// WorkerBeat is one subscription's presence record (the member's JSON).
type WorkerBeat struct {
	Consumer string `json:"consumer"`
	Stream   string `json:"stream"`
	Group    string `json:"group"`
	Agent    string `json:"agent"`
	Branch   string `json:"branch,omitempty"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
	// Started is when the process's router started (unix ms): a restarted process
	// with the same consumer name is a new member.
	Started int64 `json:"started_ms"`
}

// Workers is the key of the namespace's worker presence set.
func (t Topology) Workers() string { return t.ns() + ":workers" }

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
	args := []any{PresenceTTL.Milliseconds(), presenceKeep.Milliseconds()}
	var members []any
	for _, s := range r.subs {
		b, _ := json.Marshal(WorkerBeat{Consumer: s.consumer, Stream: s.route.Stream, Group: s.route.Group,
			Agent: r.cfg.Agent, Branch: r.cfg.Branch, Host: host, PID: os.Getpid(), Started: started})
		members = append(members, string(b))
	}
	args = append(args, members...)
	key := []string{r.cfg.Topology.Workers()}
	log := r.cfg.Logger.With().Str("key", key[0]).Logger()
	failing := false
	beat := func() {
		cctx, cancel := context.WithTimeout(ctx, PresenceInterval)
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
	t := time.NewTicker(PresenceInterval)
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

// DecodeWorkerBeat parses a member of Topology.Workers; ok is false for a member this
// version cannot read.
func DecodeWorkerBeat(member string) (WorkerBeat, bool) {
	var b WorkerBeat
	if err := json.Unmarshal([]byte(member), &b); err != nil || b.Consumer == "" {
		return WorkerBeat{}, false
	}
	return b, true
}

// String names the beat's process for operators: "host pid 123".
func (b WorkerBeat) String() string { return b.Host + " pid " + strconv.Itoa(b.PID) }
