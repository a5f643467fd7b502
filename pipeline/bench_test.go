package pipeline

import (
	"context"
	"fmt"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/subscriber"
)

// The router benchmarks consume b.N triage events with distinct issue keys through one
// subscription and a no-op handler; one op = one event consumed and acked. Each runs on
// its own redis-server (no other test's load on it), so beside ns/op they report the
// CPU that one event costs this process (cpu-ns/event, from getrusage) and the server
// (redis-cpu-ns/event, from INFO cpu): figures that a busy machine inflates far less
// than wall time; and the goroutines one event starts (goroutines/event: the router's
// one per message, and any of ours). Run both in one go to get the ratio:
//
//	go test -run '^$' -bench 'Router(Bare|Locked)$' -benchtime 3000x -count 3 -benchmem ./pipeline/
//
// BENCH_READ_BATCH=N gives both routers that ReadBatch (default DefaultReadBatch).

// BenchmarkRouterBare: a stock Watermill router on the same subscriber as NewRouter's
// (subscriber.Subscriber, its ReadBatch), no middleware, no lease.
func BenchmarkRouterBare(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	topo := event.Topology{Namespace: "ymir"}
	stream := topo.Stream("triage", "", false)
	var n atomic.Int64
	done, gate := make(chan struct{}), make(chan struct{})
	sub := benchSubscriber(b, srv.Addr(), 100*time.Millisecond)
	r, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r.AddConsumerHandler("bare", stream, sub, func(*message.Message) error {
		return count(&n, b.N, gate, done)
	})
	benchConsume(b, rdb, stream, r, gate, done)
}

// BenchmarkRouterLocked: pipeline.NewRouter, the full middleware stack with lockmw:
// acquire (fence and record) in one round trip, release and ack folded into one.
func BenchmarkRouterLocked(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	topo := event.Topology{Namespace: "ymir"}
	stream := topo.Stream("triage", "", false)
	opts, _ := ClientOptions(srv.URL())
	locker, err := lease.New(rdb, lease.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	done, gate := make(chan struct{}), make(chan struct{})
	r, err := NewRouter(RouterConfig{Client: rdb, ClientOptions: opts, Topology: topo, Agent: "triage", Consumer: "bench",
		BlockTime: 100 * time.Millisecond, Locker: locker, ReadBatch: benchReadBatch(),
		Handler: func(*message.Message) error { return count(&n, b.N, gate, done) }})
	if err != nil {
		b.Fatal(err)
	}
	benchConsume(b, rdb, stream, r, gate, done)
}

// benchSubscriber is the subscriber NewRouter gives each subscription, on a client of
// its own, without the pipeline's view (no lease, no veto).
func benchSubscriber(b *testing.B, addr string, block time.Duration) *subscriber.Subscriber {
	client := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	b.Cleanup(func() { _ = client.Close() })
	sub, err := subscriber.New(subscriber.Config{Client: client, Group: "triage", Consumer: "bench-0",
		Unmarshaller: event.Marshaller{}, BlockTime: block, ClaimInterval: DefaultClaimInterval,
		MaxIdleTime: DefaultMaxIdleTime, ReadBatch: benchReadBatch()})
	if err != nil {
		b.Fatal(err)
	}
	return sub
}

type runner interface {
	Run(context.Context) error
	Running() chan struct{}
}

// count is the benchmarks' handler: the first event (a gate, published before the
// measured ones) waits until all are in the stream, so that publishing does not compete
// with consuming; the (N+1)th event ends the run.
func count(n *atomic.Int64, total int, gate, done chan struct{}) error {
	switch n.Add(1) {
	case 1:
		<-gate
	case int64(total) + 1:
		close(done)
	}
	return nil
}

func benchConsume(b *testing.B, rdb *redis.Client, stream string, r runner, gate, done chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "triage", "0").Err(); err != nil {
		b.Fatal(err)
	}
	go func() { _ = r.Run(ctx) }()
	<-r.Running()
	pipe := rdb.Pipeline()
	for i := 0; i <= b.N; i++ {
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-` + strconv.Itoa(i+1) + `"}}`))
		msg, _ := event.New(event.TriageRequested, "RHEL-"+strconv.Itoa(i+1), task, nil)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)})
		if pipe.Len() == 500 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && pipe.Len() > 0 {
		b.Fatal(err)
	}
	cpu0, rcpu0, g0 := processCPU(), redisCPU(ctx, b, rdb), goroutinesCreated()
	b.ResetTimer()
	close(gate)
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("events not consumed")
	}
	b.StopTimer()
	cpu1, rcpu1, g1 := processCPU(), redisCPU(ctx, b, rdb), goroutinesCreated()
	if os.Getenv("BENCH_COMMANDSTATS") != "" {
		fmt.Fprintln(os.Stderr, rdb.Info(ctx, "commandstats").Val())
	}
	// The last handler returned; its ack follows within a round trip.
	deadline := time.Now().Add(10 * time.Second)
	for rdb.XPending(ctx, stream, "triage").Val().Count > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/event")
	b.ReportMetric(float64(rcpu1-rcpu0)/float64(b.N), "redis-cpu-ns/event")
	b.ReportMetric(float64(g1-g0)/float64(b.N), "goroutines/event")
}

// goroutinesCreated is the number of goroutines this process has started so far.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the user+system CPU time the server has used (INFO cpu).
func redisCPU(ctx context.Context, b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkRouterIdle: one idle worker (NewRouter with a worker's default settings:
// BLOCK_TIME 5s, CLAIM_INTERVAL 5s, MAX_IDLE_TIME 3m, MAX_LEN 100 000 so the streams are
// trimmed once a minute, one subscription on each of its two input streams) on its own
// redis-server, no events. One op is one second of idling:
//
//	go test -run '^$' -bench 'RouterIdle$' -benchtime 90x ./pipeline/
//
// It reports the commands per second the worker sends (BENCH_COMMANDSTATS=1 lists them
// on stderr), the CPU the worker uses per second, and the server's.
func BenchmarkRouterIdle(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	opts, _ := ClientOptions(srv.URL())
	locker, err := lease.New(rdb, lease.Options{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := NewRouter(RouterConfig{Client: rdb, ClientOptions: opts, Topology: event.Topology{Namespace: "ymir"}, Agent: "triage",
		Consumer: "idle", Locker: locker, MaxLen: event.DefaultMaxLen, Handler: func(*message.Message) error { return nil }})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	<-r.Running()
	time.Sleep(time.Second) // past the start: groups created, first claim pass done
	calls0, cpu0, rcpu0 := commandCalls(ctx, b, rdb), processCPU(), redisCPU(ctx, b, rdb)
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * time.Second)
	b.StopTimer()
	calls1, cpu1, rcpu1 := commandCalls(ctx, b, rdb), processCPU(), redisCPU(ctx, b, rdb)
	total := int64(0)
	for name, n := range calls1 {
		d := n - calls0[name]
		if name == "info" {
			d -= 2 // the benchmark's own INFO commandstats and INFO cpu
		}
		if d > 0 && os.Getenv("BENCH_COMMANDSTATS") != "" {
			fmt.Fprintf(os.Stderr, "%s: %.3f/s\n", name, float64(d)/float64(b.N))
		}
		total += d
	}
	secs := float64(b.N)
	b.ReportMetric(float64(total)/secs, "redis-cmds/s")
	b.ReportMetric(float64(cpu1-cpu0)/float64(time.Millisecond)/secs, "cpu-ms/s")
	b.ReportMetric(float64(rcpu1-rcpu0)/float64(time.Millisecond)/secs, "redis-cpu-ms/s")
	b.ReportMetric(0, "ns/op")
}

// commandCalls is the server's calls per command (INFO commandstats).
func commandCalls(ctx context.Context, b *testing.B, rdb *redis.Client) map[string]int64 {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		out[name], _ = strconv.ParseInt(n, 10, 64)
	}
	return out
}

// The dispatch latency benchmarks publish one event at a time into an idle router and
// time it from just before the XADD to the handler's start; the next event goes out
// once the previous one is acked. One op = one event; they report p50 and p99:
//
//	go test -run '^$' -bench 'RouterLatency' -benchtime 1000x ./pipeline/

// BenchmarkRouterLatencyBare: a stock Watermill router on NewRouter's subscriber.
func BenchmarkRouterLatencyBare(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	stream := event.Topology{Namespace: "ymir"}.Stream("triage", "", false)
	started := make(chan time.Time, 1)
	sub := benchSubscriber(b, srv.Addr(), DefaultBlockTime)
	r, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	r.AddConsumerHandler("bare", stream, sub, func(*message.Message) error { started <- time.Now(); return nil })
	benchLatency(b, rdb, stream, r, started)
}

// BenchmarkRouterLatencyLocked: NewRouter, the full middleware stack with the lease.
func BenchmarkRouterLatencyLocked(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	topo := event.Topology{Namespace: "ymir"}
	opts, _ := ClientOptions(srv.URL())
	locker, err := lease.New(rdb, lease.Options{})
	if err != nil {
		b.Fatal(err)
	}
	started := make(chan time.Time, 1)
	r, err := NewRouter(RouterConfig{Client: rdb, ClientOptions: opts, Topology: topo, Agent: "triage", Consumer: "bench",
		Locker: locker, Handler: func(*message.Message) error { started <- time.Now(); return nil }})
	if err != nil {
		b.Fatal(err)
	}
	benchLatency(b, rdb, topo.Stream("triage", "", false), r, started)
}

func benchLatency(b *testing.B, rdb *redis.Client, stream string, r runner, started chan time.Time) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "triage", "0").Err(); err != nil {
		b.Fatal(err)
	}
	go func() { _ = r.Run(ctx) }()
	<-r.Running()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := "RHEL-" + strconv.Itoa(i+1)
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
		msg, _ := event.New(event.TriageRequested, key, task, nil)
		values := event.Encode(msg)
		t0 := time.Now()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err(); err != nil {
			b.Fatal(err)
		}
		select {
		case t1 := <-started:
			lat = append(lat, t1.Sub(t0))
		case <-time.After(time.Minute):
			b.Fatal("event not dispatched")
		}
		for rdb.XPending(ctx, stream, "triage").Val().Count > 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// reportPercentiles reports p50 and p99 of lat in µs.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	at := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Microsecond) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(0, "ns/op")
}

// benchReadBatch is both routers' ReadBatch: BENCH_READ_BATCH, else DefaultReadBatch
// (docs/architecture.md, "Batched ends": the ratio per read batch).
func benchReadBatch() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_READ_BATCH")); err == nil {
		return n
	}
	return DefaultReadBatch
}
