package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
)

// ErrConsumerInUse is returned by ClaimConsumer when a live process already reads the
// group under that consumer name.
var ErrConsumerInUse = errors.New("consumer name in use")

// DefaultConsumerClaimTTL is how long a consumer-name claim outlives its last refresh.
const DefaultConsumerClaimTTL = 6 * time.Second

// ConsumerClaim is one process's claim on a consumer name of a group. Two processes
// under one name would be one consumer to Redis: the second resumes the first's pending
// entries while the first still runs them. The claim is a key holding the process's
// host, pid and a random token, taken with SET NX and refreshed every TTL/3 while the
// process lives.
type ConsumerClaim struct {
	rdb   redis.UniversalClient
	key   string
	value string
	ttl   time.Duration
	log   zerolog.Logger

	stop context.CancelFunc
	done chan struct{}
	once sync.Once
}

// ClaimConsumer claims consumer in group for this process until Release (or ctx's end).
// A claim left by a process that is gone is taken over: at once when it was made on this
// host by a pid that is no longer alive, or by this very pid (a container restarted in
// its pod keeps its hostname and pid 1); otherwise once it expires, at most ttl later
// (ttl <= 0: DefaultConsumerClaimTTL). A claim that is refreshed meanwhile, or whose
// process lives on this host, is a live process's: the error wraps ErrConsumerInUse and
// says which process.
func ClaimConsumer(ctx context.Context, rdb redis.UniversalClient, t event.Topology, group, consumer string, ttl time.Duration, log zerolog.Logger) (*ConsumerClaim, error) {
	if ttl <= 0 {
		ttl = DefaultConsumerClaimTTL
	}
	host, _ := os.Hostname()
	if host == "" || strings.ContainsAny(host, " \t\n") {
		host = "unknown"
	}
	tok := make([]byte, 8)
	_, _ = rand.Read(tok)
	c := &ConsumerClaim{rdb: rdb, key: t.ConsumerClaimKey(group, consumer), ttl: ttl, log: log,
		value: host + " " + strconv.Itoa(os.Getpid()) + " " + hex.EncodeToString(tok), done: make(chan struct{})}
	if err := c.take(ctx, host, group, consumer); err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	go c.refresh(rctx)
	return c, nil
}

func (c *ConsumerClaim) take(ctx context.Context, host, group, consumer string) error {
	deadline := time.Now().Add(c.ttl + c.ttl/2)
	var lastTTL time.Duration
	for {
		ok, err := c.rdb.SetNX(ctx, c.key, c.value, c.ttl).Result()
		if err != nil {
			return fmt.Errorf("claim consumer name %s of group %s: %w", consumer, group, err)
		}
		if ok {
			return nil
		}
		old, err := c.rdb.Get(ctx, c.key).Result()
		if errors.Is(err, redis.Nil) {
			continue // expired between the two calls
		}
		if err != nil {
			return fmt.Errorf("claim consumer name %s of group %s: %w", consumer, group, err)
		}
		oldHost, oldPid := parseClaim(old)
		if oldHost == host && (oldPid == os.Getpid() || !processAlive(oldPid)) {
			// Left by a process of this host that is gone: take it over, unless it
			// changed meanwhile.
			took, err := swapScript.Run(ctx, c.rdb, []string{c.key}, old, c.value, c.ttl.Milliseconds()).Int()
			if err != nil {
				return fmt.Errorf("claim consumer name %s of group %s: %w", consumer, group, err)
			}
			if took == 1 {
				c.log.Info().Str("consumer", consumer).Str("group", group).Int("previous_pid", oldPid).
					Msg("took over the consumer name of a process that is gone")
				return nil
			}
			continue
		}
		inUse := fmt.Errorf("%w: pid %d on host %s reads group %s as %s", ErrConsumerInUse, oldPid, oldHost, group, consumer)
		if oldHost == host {
			return inUse // alive here: no need to wait for a refresh to know
		}
		// Another host: alive if it refreshes its claim, gone if the claim expires.
		left, err := c.rdb.PTTL(ctx, c.key).Result()
		if err != nil {
			return fmt.Errorf("claim consumer name %s of group %s: %w", consumer, group, err)
		}
		if lastTTL > 0 && left > lastTTL {
			return inUse
		}
		lastTTL = left
		if time.Now().After(deadline) {
			return inUse
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(c.ttl / 10):
		}
	}
}

// refresh extends the claim every TTL/3 until stopped. A refresh that finds the claim
// gone (it expired while Redis was out of reach) takes it again if it is free.
func (c *ConsumerClaim) refresh(ctx context.Context) {
	defer close(c.done)
	tick := time.NewTicker(c.ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := refreshScript.Run(ctx, c.rdb, []string{c.key}, c.value, c.ttl.Milliseconds()).Int()
		switch {
		case err != nil && ctx.Err() == nil:
			c.log.Warn().Err(err).Str("key", c.key).Msg("consumer name claim: refresh failed; retrying")
		case err == nil && n == 0:
			c.log.Error().Str("key", c.key).Msg("consumer name claim: taken by another process while this one was out of reach; two processes may share the consumer name")
		}
	}
}

// Release stops refreshing the claim and deletes it (if still this process's), so that
// a restart under the same name starts at once.
func (c *ConsumerClaim) Release(ctx context.Context) {
	c.once.Do(func() {
		c.stop()
		<-c.done
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := releaseScript.Run(ctx, c.rdb, []string{c.key}, c.value).Err(); err != nil {
			c.log.Warn().Err(err).Str("key", c.key).Msg("consumer name claim: release failed; it expires by itself")
		}
	})
}

func parseClaim(v string) (host string, pid int) {
	f := strings.Fields(v)
	if len(f) < 2 {
		return "", 0
	}
	pid, _ = strconv.Atoi(f[1])
	return f[0], pid
}

// processAlive reports whether pid names a live process of this host (signal 0: EPERM
// means it lives under another user).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

var (
	// KEYS[1] claim; ARGV[1] the expected value, ARGV[2] the new one, ARGV[3] TTL in ms.
	swapScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0`)
	// KEYS[1] claim; ARGV[1] this process's value, ARGV[2] TTL in ms. 1: refreshed or
	// taken again (it was free), 0: another process holds it.
	refreshScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`)
	// KEYS[1] claim; ARGV[1] this process's value.
	releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)
