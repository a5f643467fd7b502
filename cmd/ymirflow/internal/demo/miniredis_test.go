package demo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// backends are the embedded Redis as the demo runs it (ClockTTL on) and the real test
// Redis; each gets a fresh key prefix.
func backends(t *testing.T) map[string]func(t *testing.T) (redis.UniversalClient, string) {
	return map[string]func(t *testing.T) (redis.UniversalClient, string){
		"miniredis": func(t *testing.T) (redis.UniversalClient, string) {
			m := miniredis.NewMiniRedis()
			m.ClockTTL(true)
			if err := m.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			c := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
			t.Cleanup(func() { c.Close() })
			return c, "p:"
		},
		"redis": func(t *testing.T) (redis.UniversalClient, string) {
			c, ns := redistest.Client(t)
			return c, ns
		},
	}
}

// TestEmbeddedRedisSpeaksThePipeline runs every command and script shape the pipeline,
// watermill-redisstream, lockmw and the fetcher use against miniredis and against the
// real Redis, and expects the same answers.
func TestEmbeddedRedisSpeaksThePipeline(t *testing.T) {
	t.Parallel()
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			c, p := open(t)
			ctx := context.Background()
			s, id1, id2 := speakStreams(ctx, t, c, p)
			speakBlockedRead(ctx, t, c, p)
			speakPendingAndClaims(ctx, t, c, s, id1, id2)
			speakLease(ctx, t, c, p, s, id2)
			speakTTLAndLua(ctx, t, c, p, s, id1, id2)
		})
	}
}

// mustFn returns the check of a command's error: any but redis.Nil ends the test.
func mustFn(t *testing.T) func(error) {
	return func(err error) {
		t.Helper()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
	}
}

// speakStreams: a group, XADD with and without MAXLEN, XREADGROUP. It returns the
// stream and its two entries' ids.
func speakStreams(ctx context.Context, t *testing.T, c redis.UniversalClient, p string) (s, id1, id2 string) {
	must := mustFn(t)
	var err error
	s = p + "s"
	must(c.XGroupCreateMkStream(ctx, s, "g", "0").Err())
	if err := c.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err == nil || !redis.HasErrorPrefix(err, "BUSYGROUP") {
		t.Errorf("second XGROUP CREATE: %v, want BUSYGROUP", err)
	}
	id1, err = c.XAdd(ctx, &redis.XAddArgs{Stream: s, MaxLen: 100, Approx: true, Values: map[string]any{"a": "1"}}).Result()
	must(err)
	id2, err = c.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"a": "2"}}).Result()
	must(err)
	got, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{s, ">"}, Count: 1, Block: 100 * time.Millisecond}).Result()
	must(err)
	if len(got) != 1 || len(got[0].Messages) != 1 || got[0].Messages[0].ID != id1 {
		t.Fatalf("XREADGROUP: %+v", got)
	}
	return s, id1, id2
}

// speakBlockedRead: a blocked XREADGROUP wakes up on XADD.
func speakBlockedRead(ctx context.Context, t *testing.T, c redis.UniversalClient, p string) {
	must := mustFn(t)
	s2 := p + "s2"
	must(c.XGroupCreateMkStream(ctx, s2, "g", "$").Err())
	woke := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		r, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{s2, ">"}, Count: 1, Block: 3 * time.Second}).Result()
		if err != nil || len(r) == 0 {
			woke <- -1
			return
		}
		woke <- time.Since(start)
	}()
	// Time for the XREADGROUP to block (neither server says so to a client; if it has
	// not blocked yet, it reads the entry at once and the check proves less, never fails).
	time.Sleep(100 * time.Millisecond)
	must(c.XAdd(ctx, &redis.XAddArgs{Stream: s2, Values: map[string]any{"x": "1"}}).Err())
	if d := <-woke; d < 0 || d > 2*time.Second {
		t.Errorf("blocked XREADGROUP woke after %s", d)
	}
}

// speakPendingAndClaims: XPENDING extended, XCLAIM, XAUTOCLAIM, XINFO, XACK, XTRIM.
func speakPendingAndClaims(ctx context.Context, t *testing.T, c redis.UniversalClient, s, id1, id2 string) {
	must := mustFn(t)
	// XPENDING extended, with IDLE and a consumer.
	pe, err := c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "g", Start: "-", End: "+", Count: 10, Consumer: "c1"}).Result()
	must(err)
	if len(pe) != 1 || pe[0].ID != id1 || pe[0].Consumer != "c1" || pe[0].RetryCount != 1 {
		t.Errorf("XPENDING: %+v", pe)
	}
	pe, err = c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "g", Idle: time.Minute, Start: "-", End: "+", Count: 10}).Result()
	must(err)
	if len(pe) != 0 {
		t.Errorf("XPENDING IDLE 60s: %+v, want none", pe)
	}
	// XCLAIM to self with IDLE and JUSTID (the re-mark of a restarted consumer).
	must(c.Do(ctx, "XCLAIM", s, "g", "c1", 0, id1, "IDLE", 5000, "JUSTID").Err())
	pe, err = c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "g", Idle: 4 * time.Second, Start: "-", End: "+", Count: 10}).Result()
	must(err)
	if len(pe) != 1 || pe[0].Idle < 4*time.Second {
		t.Errorf("after XCLAIM IDLE 5000: %+v", pe)
	}
	// XCLAIM JUSTID with min-idle 0 (the lease's heartbeat keeps its entry young).
	ids, err := c.XClaimJustID(ctx, &redis.XClaimArgs{Stream: s, Group: "g", Consumer: "c1", Messages: []string{id1}}).Result()
	must(err)
	if len(ids) != 1 || ids[0] != id1 {
		t.Errorf("XCLAIM JUSTID: %v", ids)
	}
	// XCLAIM with RETRYCOUNT (the subscriber takes what a read or claim whose reply was
	// lost delivered, its delivery count kept).
	must(c.Do(ctx, "XCLAIM", s, "g", "c1", 0, id1, "RETRYCOUNT", 3).Err())
	pe, err = c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "g", Start: id1, End: id1, Count: 1, Consumer: "c1"}).Result()
	must(err)
	if len(pe) != 1 || pe[0].RetryCount != 3 {
		t.Errorf("after XCLAIM RETRYCOUNT 3: %+v", pe)
	}
	must(c.Do(ctx, "XCLAIM", s, "g", "c1", 0, id1, "IDLE", 5000, "JUSTID").Err())
	claimed, _, err := c.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: s, Group: "g", Consumer: "c2", MinIdle: time.Second, Start: "0-0", Count: 10}).Result()
	must(err)
	if len(claimed) != 1 || claimed[0].ID != id1 {
		t.Errorf("XAUTOCLAIM: %+v", claimed)
	}
	groups, err := c.XInfoGroups(ctx, s).Result()
	must(err)
	if len(groups) != 1 || groups[0].Name != "g" || groups[0].Pending != 1 || groups[0].LastDeliveredID != id1 {
		t.Errorf("XINFO GROUPS: %+v", groups)
	}
	cons, err := c.XInfoConsumers(ctx, s, "g").Result()
	must(err)
	if len(cons) != 2 {
		t.Errorf("XINFO CONSUMERS: %+v", cons)
	}
	if n, err := c.XAck(ctx, s, "g", id1).Result(); err != nil || n != 1 {
		t.Errorf("XACK: %d %v", n, err)
	}
	must(c.XGroupDelConsumer(ctx, s, "g", "c2").Err())
	must(c.XTrimMinIDApprox(ctx, s, id2, 0).Err())
	if n := c.XLen(ctx, s).Val(); n < 1 {
		t.Errorf("XTRIM MINID removed %s", id2)
	}
}

// speakLease: the lease: SET NX PX, scripts, fencing, release, in one pipeline where asked.
func speakLease(ctx context.Context, t *testing.T, c redis.UniversalClient, p, s, id2 string) {
	must := mustFn(t)
	locker, err := lease.New(c, lease.Options{TTL: 2 * time.Second, Scope: p})
	must(err)
	le, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w1", MessageID: id2,
		OnHeartbeat: func(ctx context.Context, pipe redis.Pipeliner) {
			pipe.XClaimJustID(ctx, &redis.XClaimArgs{Stream: s, Group: "g", Consumer: "c1", Messages: []string{id2}})
		}})
	must(err)
	if _, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w2"}); !errors.Is(err, lease.ErrLocked) {
		t.Errorf("second acquire: %v, want ErrLocked", err)
	}
	// Past the TTL: only the heartbeats keep it. The TTL is seconds so that a
	// loaded machine's stall does not outlast it.
	time.Sleep(2600 * time.Millisecond)
	if err := le.Check(ctx); err != nil {
		t.Errorf("lease after heartbeats: %v", err)
	}
	if _, err := le.XAdd(ctx, p+"out", 0, map[string]any{"k": "v"}); err != nil {
		t.Errorf("fenced XADD: %v", err)
	}
	info, held, err := locker.Inspect(ctx, "triage", "RHEL-1")
	if err != nil || !held || info.Owner != "w1" || info.Fence != le.Fence() {
		t.Errorf("Inspect: %+v %v %v", info, held, err)
	}
	if ok, err := le.Release(ctx); !ok || err != nil {
		t.Errorf("release: %v %v", ok, err)
	}
	if _, err := le.XAdd(ctx, p+"out", 0, map[string]any{"k": "v"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("fenced XADD after release: %v, want ErrLeaseLost", err)
	}
	again, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w2", EntryTime: time.Now().Add(-time.Hour)})
	var sup *lease.SupersededError
	if err == nil || !errors.As(err, &sup) {
		t.Errorf("acquire of an event older than the release: %v, want superseded", err)
		if again != nil {
			again.Release(ctx)
		}
	}
	next, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w2"})
	must(err)
	if next.Fence() <= le.Fence() {
		t.Errorf("fence %d after %d", next.Fence(), le.Fence())
	}
	next.Release(ctx)
}

// speakTTLAndLua: a key's TTL runs out by the clock; the Lua shapes the scripts use.
func speakTTLAndLua(ctx context.Context, t *testing.T, c redis.UniversalClient, p, s, id1, id2 string) {
	must := mustFn(t)
	// A key's TTL runs out by the clock (miniredis: thanks to ClockTTL).
	must(c.Set(ctx, p+"ttl", "x", 200*time.Millisecond).Err())
	time.Sleep(400 * time.Millisecond) // the point: past the 200ms TTL
	if n := c.Exists(ctx, p+"ttl").Val(); n != 0 {
		t.Errorf("a key with a 200ms TTL still exists after 400ms")
	}

	// Lua shapes the fetcher's scripts use.
	lua := []struct {
		name, src string
		keys      []string
		args      []any
		check     func(v any, err error) bool
	}{
		{"TIME in ms", "local t = redis.call('TIME'); return t[1] * 1000 + math.floor(t[2] / 1000)", nil, nil,
			func(v any, err error) bool { n, _ := v.(int64); return err == nil && n > 1.6e12 }},
		{"string.match", "local a, b = string.match(ARGV[1], '^(%d+) (%S+)'); return {a, b}", nil, []any{"12 x-1"},
			func(v any, err error) bool {
				l, _ := v.([]any)
				return err == nil && len(l) == 2 && l[0] == "12" && l[1] == "x-1"
			}},
		{"unpack XADD", "local a = {'XADD', KEYS[1], 'MAXLEN', '~', 10, '*', 'f', 'v'}; return redis.call(unpack(a))", []string{p + "lua"}, nil,
			func(v any, err error) bool { s, _ := v.(string); return err == nil && s != "" }},
		{"error_reply", "return redis.error_reply('LEASELOST lease is no longer held')", nil, nil,
			func(v any, err error) bool { return err != nil && redis.HasErrorPrefix(err, "LEASELOST") }},
		{"HSET many", "redis.call('HSET', KEYS[1], 'a', 1, 'b', 2, 'c', 3, 'd', 4, 'e', 5); return redis.call('HLEN', KEYS[1])", []string{p + "h"}, nil,
			func(v any, err error) bool { return err == nil && v == int64(5) }},
		{"XINFO GROUPS in Lua", `
local last
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, ld
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end
  end
  if name == 'g' then last = ld end
end
return last`, []string{s}, nil,
			func(v any, err error) bool { return err == nil && v == id1 }},
		{"XPENDING range in Lua", "return #redis.call('XPENDING', KEYS[1], 'g', ARGV[1], ARGV[1], 1)", []string{s}, []any{id1},
			func(v any, err error) bool { return err == nil && v == int64(0) }},
		{"XRANGE fields in Lua", `
local xs = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1)
if #xs == 0 then return false end
local f = xs[1][2]
for i = 1, #f, 2 do
  if f[i] == 'a' and not string.find(f[i + 1], '%s') then return f[i + 1] end
end
return false`, []string{s}, []any{id2},
			func(v any, err error) bool { return err == nil && v == "2" }},
		{"string.match, three parts", "local a, b, c = string.match(ARGV[1], '^(%S+) (%S+) (%S+)$'); return {a, b, c}", nil, []any{"1-0 s u"},
			func(v any, err error) bool {
				l, _ := v.([]any)
				return err == nil && len(l) == 3 && l[2] == "u"
			}},
		{"false is nil", "local w = false; return w and 'x'", nil, nil,
			func(v any, err error) bool { return errors.Is(err, redis.Nil) }},
	}
	for _, l := range lua {
		v, err := c.Eval(ctx, l.src, l.keys, l.args...).Result()
		if !l.check(v, err) {
			t.Errorf("Lua %s: %v, %v", l.name, v, err)
		}
		sha, err := c.ScriptLoad(ctx, l.src).Result()
		must(err)
		v, err = c.EvalSha(ctx, sha, l.keys, l.args...).Result()
		if !l.check(v, err) {
			t.Errorf("EVALSHA %s: %v, %v", l.name, v, err)
		}
	}
}

// TestEmbeddedRedisDifferences pins what miniredis does differently, so a new version
// that changes it is noticed (the demo's settings rely on these).
func TestEmbeddedRedisDifferences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			c, p := open(t)
			s := p + "d"
			if err := c.XGroupCreateMkStream(ctx, s, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			id, _ := c.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"a": "1"}}).Result()
			c.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"a": "2"}})
			c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{s, ">"}, Count: 1})
			// XCLAIM with a min-idle-time the entry has not reached.
			got, err := c.XClaim(ctx, &redis.XClaimArgs{Stream: s, Group: "g", Consumer: "c2", MinIdle: time.Hour, Messages: []string{id}}).Result()
			if err != nil {
				t.Fatal(err)
			}
			wantClaimed := 0
			if name == "miniredis" {
				wantClaimed = 1 // miniredis ignores min-idle-time
			}
			if len(got) != wantClaimed {
				t.Errorf("XCLAIM MinIdle 1h of a fresh entry claimed %d, want %d on %s", len(got), wantClaimed, name)
			}
			g, err := c.XInfoGroups(ctx, s).Result()
			if err != nil || len(g) != 1 {
				t.Fatal(g, err)
			}
			wantLag := int64(1)
			if name == "miniredis" {
				wantLag = 2 // the stream's length: no entries-read
			}
			if g[0].Lag != wantLag {
				t.Errorf("XINFO GROUPS lag %d, want %d on %s", g[0].Lag, wantLag, name)
			}
		})
	}
	// Without ClockTTL, miniredis never expires a key by itself.
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), DisableIdentity: true})
	defer c.Close()
	c.Set(ctx, "k", "v", 50*time.Millisecond)
	time.Sleep(150 * time.Millisecond) // the point: past the 50ms TTL
	if c.Exists(ctx, "k").Val() != 1 {
		t.Error("miniredis without ClockTTL expired a key by itself: the demo's ClockTTL may no longer be needed")
	}
}
