package fetcher

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// roundTrips counts what a go-redis client sends: one per command outside a pipeline, one
// per pipeline (or transaction), whatever its length.
type roundTrips struct{ n, cmds atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		r.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		r.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestPrecheckIsOneRoundTrip: whatever the batch size, the lease keys of every stage and
// the queued markers of every candidate are read in one pipelined round trip. A second one
// is made only when some candidate has a queued marker (to renew it and, for an entry
// already delivered to the triage group, to confirm it is still pending).
func TestPrecheckIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	locker, _ := lease.New(rdb, lease.Options{Scope: topo.LockScope()})
	jc, _ := jira.New(jira.Options{})
	f, err := New(Config{Jira: jc, Redis: rdb, Topology: topo, Locker: locker, JQL: "x"})
	if err != nil {
		t.Fatal(err)
	}
	rt := &roundTrips{}
	rdb.AddHook(rt)

	keysN := func(from, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("RT-%d", from+i)
		}
		return out
	}
	measure := func(keys []string) (precheckResult, int64, int64) {
		t.Helper()
		if _, err := f.precheck(ctx, keys, nil); err != nil { // warm: no dialling counted
			t.Fatal(err)
		}
		rt.n.Store(0)
		rt.cmds.Store(0)
		res, err := f.precheck(ctx, keys, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res, rt.n.Load(), rt.cmds.Load()
	}

	// Leases at every stage.
	for i, a := range event.Agents {
		if _, err := locker.Acquire(ctx, a, fmt.Sprintf("RT-%d", 10+i), lease.AcquireOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []int{1, 10, 200, 5000} {
		res, trips, cmds := measure(keysN(1, n))
		if trips != 1 || res.roundTrips != 1 {
			t.Errorf("batch of %d: %d round trips (%d commands), want 1", n, trips, cmds)
		}
		if want := min(max(n-9, 0), 4); len(res.locked) != want {
			t.Errorf("batch of %d: locked %v, want %d", n, res.locked, want)
		}
		t.Logf("batch of %d: %d round trip, %d commands", n, trips, cmds)
	}
	res, _, _ := measure(keysN(1, 20))
	for i, a := range event.Agents {
		if got := res.locked[fmt.Sprintf("RT-%d", 10+i)]; got != a {
			t.Errorf("RT-%d locked by %q, want %s", 10+i, got, a)
		}
	}

	// Issues RT-100..104 were published and wait unread.
	for i := 100; i < 105; i++ {
		k := fmt.Sprintf("RT-%d", i)
		msg, _ := event.New(event.TriageRequested, k, triageTask(k, false), nil)
		if _, _, err := f.publish(ctx, k, topo.Stream("triage", "", false), event.Encode(msg)); err != nil {
			t.Fatal(err)
		}
	}
	if res, trips, _ := measure(keysN(1000, 3000)); trips != 1 || len(res.queued) != 0 {
		t.Errorf("batch without published issues: %d round trips, queued %v", trips, res.queued)
	}
	res, trips, _ := measure(keysN(1, 5000))
	if trips != 2 || len(res.queued) != 5 {
		t.Errorf("batch with 5 waiting: %d round trips, queued %v; want 2 and 5", trips, res.queued)
	}

	// Delivered entries: 3 read by a worker (pending), 2 still unread; then all acked.
	s := topo.Stream("triage", "", false)
	rdb.XGroupCreateMkStream(ctx, s, "triage", "0")
	xs, _ := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "w", Streams: []string{s, ">"}, Count: 3, Block: -1}).Result()
	res, trips, _ = measure(keysN(1, 5000))
	if trips != 2 || len(res.queued) != 5 {
		t.Errorf("3 pending + 2 unread: %d round trips, queued %v; want 2 and 5", trips, res.queued)
	}
	for _, m := range xs[0].Messages {
		rdb.XAck(ctx, s, "triage", m.ID)
	}
	if res, _, _ = measure(keysN(1, 5000)); len(res.queued) != 2 {
		t.Errorf("after 3 acks: queued %v, want the 2 unread", res.queued)
	}
}

// BenchmarkLockPrecheckPipelinedExists times the fetcher's pre-check for 1 000 candidates:
// the leases of 4 stages and the queued marker of each, point lookups in one pipelined
// round trip. BenchmarkLockPrecheckScan is upstream's way, widened to every stage: SCAN
// MATCH lock:* COUNT 100 over the whole keyspace. Both run against the same private Redis
// holding `keyspace` keys, 1 000 of them leases (100 on candidates), straight on loopback
// (net=loopback) and through a delay line holding every request 200µs (net=delay200µs,
// about a pod-to-pod round trip; the µs-ping metric is the round trip actually measured):
//
//	go test ./fetcher -run '^$' -bench LockPrecheck -benchtime 2s
func BenchmarkLockPrecheckPipelinedExists(b *testing.B) {
	benchPrecheck(b, func(ctx context.Context, fx *benchFixture, rdb *redis.Client) (int, error) {
		res, err := fx.f.precheck(ctx, fx.candidates, nil)
		return len(res.locked), err
	})
}

// BenchmarkLockPrecheckScan: see BenchmarkLockPrecheckPipelinedExists.
func BenchmarkLockPrecheckScan(b *testing.B) {
	benchPrecheck(b, func(ctx context.Context, fx *benchFixture, rdb *redis.Client) (int, error) {
		set := map[string]bool{}
		iter := rdb.Scan(ctx, 0, "lock:*", 100).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			set[k[strings.LastIndexByte(k, ':')+1:]] = true
		}
		if err := iter.Err(); err != nil {
			return 0, err
		}
		locked := 0
		for _, c := range fx.candidates {
			if set[c] {
				locked++
			}
		}
		return locked, nil
	})
}

func benchPrecheck(b *testing.B, run func(context.Context, *benchFixture, *redis.Client) (int, error)) {
	for _, size := range []int{10_000, 100_000} {
		fx := benchEnv(b, size)
		for _, rtt := range []time.Duration{0, 200 * time.Microsecond} {
			name := "net=loopback"
			if rtt > 0 {
				name = "net=delay" + rtt.String()
			}
			b.Run(fmt.Sprintf("keyspace=%d/%s", size, name), func(b *testing.B) {
				ctx := context.Background()
				rdb := fx.rdb
				f := fx.f
				if rtt > 0 {
					rdb = redis.NewClient(&redis.Options{Addr: delayLine(b, fx.addr, rtt), DisableIdentity: true})
					defer rdb.Close()
					var err error
					fx2 := *fx
					fx2.f, err = New(Config{Jira: fx.f.jira, Redis: rdb, Topology: fx.f.topo, Locker: fx.f.locker, JQL: "x", Logger: zerolog.Nop()})
					if err != nil {
						b.Fatal(err)
					}
					f = fx2.f
				}
				fxr := *fx
				fxr.f = f
				if _, err := run(ctx, &fxr, rdb); err != nil { // warm the connection
					b.Fatal(err)
				}
				// The round trip actually measured (the delay line adds scheduling to d).
				start := time.Now()
				for i := 0; i < 20; i++ {
					rdb.Ping(ctx)
				}
				pingRTT := time.Since(start) / 20
				var locked int
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					n, err := run(ctx, &fxr, rdb)
					if err != nil {
						b.Fatal(err)
					}
					locked = n
				}
				b.StopTimer()
				if locked != fx.wantLocked {
					b.Fatalf("locked %d, want %d", locked, fx.wantLocked)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N)/float64(len(fx.candidates)), "µs/candidate")
				b.ReportMetric(float64(pingRTT.Microseconds()), "µs-ping")
			})
		}
	}
}

type benchFixture struct {
	rdb        *redis.Client
	addr       string
	f          *Fetcher
	candidates []string
	wantLocked int
}

// benchEnv starts a private Redis holding size keys: 1 000 leases spread over the four
// stages (every 10th candidate is locked, the other leases are on other issues), and
// unrelated keys for the rest.
func benchEnv(b *testing.B, size int) *benchFixture {
	b.Helper()
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	ctx := context.Background()
	topo := event.Topology{}
	locker, _ := lease.New(rdb, lease.Options{Scope: topo.LockScope()})
	const leases, candidates = 1000, 1000
	fx := &benchFixture{rdb: rdb, addr: srv.Addr()}
	for i := 0; i < candidates; i++ {
		fx.candidates = append(fx.candidates, fmt.Sprintf("RHEL-%d", 100000+i))
	}
	pipe := rdb.Pipeline()
	for i := 0; i < leases; i++ {
		issue := fmt.Sprintf("RHEL-%d", 500000+i)
		if i < candidates/10 {
			issue = fx.candidates[i*10]
			fx.wantLocked++
		}
		pipe.Set(ctx, locker.Keys(event.Agents[i%len(event.Agents)], issue).Lock, "token", time.Hour)
	}
	for i := 0; i < size-leases; i++ {
		pipe.Set(ctx, fmt.Sprintf("mr_metadata:backport:pkg%d:%016x", i%500, i), "{}", 0)
		if pipe.Len() >= 10000 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	if n := rdb.DBSize(ctx).Val(); n != int64(size) {
		b.Fatalf("keyspace %d, want %d", n, size)
	}
	jc, _ := jira.New(jira.Options{})
	var err error
	fx.f, err = New(Config{Jira: jc, Redis: rdb, Topology: topo, Locker: locker, JQL: "x", Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	return fx
}

// delayLine is a TCP proxy to addr that delivers every chunk a client sends d after it
// was sent (latency without a bandwidth limit: chunks in flight overlap); replies pass
// straight through. It returns the proxy's address and stops with the benchmark.
func delayLine(b *testing.B, addr string, d time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			type chunk struct {
				at   time.Time
				data []byte
			}
			q := make(chan chunk, 1024)
			go func() {
				defer close(q)
				for {
					buf := make([]byte, 64<<10)
					n, err := c.Read(buf)
					if n > 0 {
						q <- chunk{time.Now().Add(d), buf[:n]}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer s.Close()
				for ch := range q {
					time.Sleep(time.Until(ch.at))
					if _, err := s.Write(ch.data); err != nil {
						return
					}
				}
			}()
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, s)
			}()
		}
	}()
	return ln.Addr().String()
}

// The publish script decides atomically, whatever the pre-check saw: a marker whose entry
// is unread or pending blocks; one whose entry was acked, trimmed or whose stream is gone
// does not.
func TestPublishScript(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	jc, _ := jira.New(jira.Options{})
	f, err := New(Config{Jira: jc, Redis: rdb, Topology: topo, JQL: "x", QueuedTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s, todo := topo.Stream("triage", "", false), topo.Stream("triage", "", true)
	pub := func(key, stream string) (string, bool) {
		t.Helper()
		msg, _ := event.New(event.TriageRequested, key, triageTask(key, false), nil)
		id, fresh, err := f.publish(ctx, key, stream, event.Encode(msg))
		if err != nil {
			t.Fatal(err)
		}
		return id, fresh
	}
	id1, fresh := pub("RHEL-1", s)
	if !fresh {
		t.Fatal("first publish not fresh")
	}
	uuid, _ := rdb.XRange(ctx, s, id1, id1).Val()[0].Values[event.FieldUUID].(string)
	if m := rdb.Get(ctx, topo.Queued("triage", "RHEL-1")).Val(); uuid == "" || m != id1+" "+s+" "+uuid {
		t.Errorf("marker %q, want %q", m, id1+" "+s+" "+uuid)
	}
	if ttl := rdb.PTTL(ctx, topo.Queued("triage", "RHEL-1")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("marker TTL %s", ttl)
	}
	// Unread, no group yet: blocks, on either triage stream.
	if id, fresh := pub("RHEL-1", todo); fresh || id != id1 {
		t.Errorf("unread: fresh=%v id %s", fresh, id)
	}
	// Pending: blocks.
	rdb.XGroupCreate(ctx, s, "triage", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "w", Streams: []string{s, ">"}, Count: 10, Block: -1})
	if _, fresh := pub("RHEL-1", s); fresh {
		t.Error("pending entry published again")
	}
	// Acked: a new publish.
	rdb.XAck(ctx, s, "triage", id1)
	id2, fresh := pub("RHEL-1", s)
	if !fresh || id2 == id1 {
		t.Errorf("after ack: fresh=%v id %s", fresh, id2)
	}
	// Unread after the group's last-delivered id: blocks.
	if _, fresh := pub("RHEL-1", s); fresh {
		t.Error("unread entry published again")
	}
	// Deleted from the stream while unread: a new publish.
	rdb.XDel(ctx, s, id2)
	if _, fresh := pub("RHEL-1", s); !fresh {
		t.Error("deleted entry still blocks")
	}
	// Stream gone: a new publish.
	rdb.Del(ctx, s)
	if _, fresh := pub("RHEL-1", s); !fresh {
		t.Error("entry of a deleted stream still blocks")
	}
}

// A stream deleted and created again restarts its ids: its first entry takes the id of an
// entry of the old stream whenever both were added in the same millisecond. A marker
// naming that id must not take the newcomer (another issue's request) for its own entry:
// neither the pre-check nor the publish script may skip the issue, whether the newcomer is
// unread or pending. The marker's own entry at that id (restored, same UUID) still blocks.
func TestRecreatedStreamReusesAnID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		delivered bool // the newcomer was read by a worker: pending
		own       bool // the entry at the id is the marker's own
		queued    bool
	}{
		{name: "unread newcomer"},
		{name: "pending newcomer", delivered: true},
		{name: "own entry unread", own: true, queued: true},
		{name: "own entry pending", own: true, delivered: true, queued: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, []fakejira.Issue{iss("RHEL-2")})
			if s := h.sweep(); s.Published != 1 {
				t.Fatal(s)
			}
			stream := h.topo.Stream("triage", "", false)
			old := h.rdb.XRange(h.ctx, stream, "-", "+").Val()[0]
			values := old.Values
			if !tc.own {
				msg, _ := event.New(event.TriageRequested, "RHEL-1", triageTask("RHEL-1", false), nil)
				values = event.Encode(msg)
			}
			h.rdb.Del(h.ctx, stream)
			if err := h.rdb.XAdd(h.ctx, &redis.XAddArgs{Stream: stream, ID: old.ID, Values: values}).Err(); err != nil {
				t.Fatal(err)
			}
			f := h.fetcher()
			if tc.delivered {
				h.deliver()
			}
			pre, err := f.precheck(h.ctx, []string{"RHEL-2"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, queued := pre.queued["RHEL-2"]; queued != tc.queued {
				t.Errorf("pre-check: queued %v, want %v (marker %q, entry %s %v)", pre.queued, tc.queued,
					h.rdb.Get(h.ctx, h.topo.Queued("triage", "RHEL-2")).Val(), old.ID, values)
			}
			msg, _ := event.New(event.TriageRequested, "RHEL-2", triageTask("RHEL-2", false), nil)
			id, fresh, err := f.publish(h.ctx, "RHEL-2", stream, event.Encode(msg))
			if err != nil {
				t.Fatal(err)
			}
			if fresh == tc.queued {
				t.Errorf("publish script: fresh=%v id %s, want fresh=%v", fresh, id, !tc.queued)
			}
		})
	}
}
