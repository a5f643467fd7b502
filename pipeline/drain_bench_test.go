package pipeline

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// drainEvents is how many events one drain consumes.
const drainEvents = 5000

// BenchmarkDrainBesideFloor drains 5 000 triage events with no-op handlers twice on
// one redis-server of its own, in one run: first with the floor, a raw go-redis
// consumer (XREADGROUP COUNT 100, then one XACK for the batch), then with NewRouter (our
// subscriber, the whole middleware stack, the lease). One op is both drains:
//
//	go test -run '^$' -bench 'DrainBesideFloor$' -benchtime 3x ./pipeline/
//
// It reports each side's events/s and their ratio (router/floor), the Redis commands
// per event from INFO commandstats (commands a script runs count too: they are Redis
// work), and the server time per event: cmd-us is INFO commandstats' usec (a script's
// own usec includes its commands', which also count on their own: an upper bound for
// the router), cpu-us is INFO cpu's (everything the server did, I/O included).
// BENCH_COMMANDSTATS=1 lists the router's commands per event on stderr.
//
// DRAIN_CONCURRENCY (default 1) is how many routers drain at once, each a consumer of
// its own, as that many single-subscription workers would. DRAIN_PAUSES=1 gives the
// routers the pauses, as every worker has them (each event's pause check).
//
// DRAIN_BESIDE, when set, names a program that drains beside them, on the same server
// in the same run (docs/architecture.md, "Cost per event": an asynq server, built
// outside the repo): `$DRAIN_BESIDE enqueue ADDR N` puts N tasks in, unmeasured, then
// `$DRAIN_BESIDE drain ADDR N C` works them off with concurrency C (DRAIN_CONCURRENCY
// again: equal concurrency on both sides) and prints the nanoseconds it took; its
// figures are reported as beside-*.
func BenchmarkDrainBesideFloor(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	var floor, router, beside drainCost
	for i := 0; i < b.N; i++ {
		floor.add(measureDrain(b, rdb, "floor"+strconv.Itoa(i), drainFloor))
		router.add(measureDrain(b, rdb, "router"+strconv.Itoa(i), func(ctx context.Context, b *testing.B, rdb *redis.Client, ns string) {
			drainRouter(ctx, b, rdb, srv.URL(), ns)
		}))
		if prog := os.Getenv("DRAIN_BESIDE"); prog != "" {
			beside.add(measureBeside(b, rdb, srv.Addr(), prog))
		}
	}
	if os.Getenv("BENCH_COMMANDSTATS") != "" {
		for name, n := range router.calls {
			fmt.Fprintf(os.Stderr, "router %s: %.2f/event\n", name, float64(n)/float64(router.events))
		}
		for name, n := range beside.calls {
			fmt.Fprintf(os.Stderr, "beside %s: %.2f/event\n", name, float64(n)/float64(beside.events))
		}
	}
	if beside.events > 0 {
		b.ReportMetric(beside.rate(), "beside-events/s")
		b.ReportMetric(router.rate()/beside.rate(), "router/beside")
		b.ReportMetric(beside.perEvent(beside.total()), "beside-cmds/event")
		b.ReportMetric(beside.perEvent(float64(beside.usec)), "beside-cmd-us/event")
		b.ReportMetric(beside.perEvent(float64(beside.cpu.Microseconds())), "beside-cpu-us/event")
	}
	b.ReportMetric(floor.rate(), "floor-events/s")
	b.ReportMetric(router.rate(), "router-events/s")
	b.ReportMetric(router.rate()/floor.rate(), "router/floor")
	b.ReportMetric(floor.perEvent(floor.total()), "floor-cmds/event")
	b.ReportMetric(router.perEvent(router.total()), "router-cmds/event")
	b.ReportMetric(floor.perEvent(float64(floor.usec)), "floor-cmd-us/event")
	b.ReportMetric(router.perEvent(float64(router.usec)), "router-cmd-us/event")
	b.ReportMetric(floor.perEvent(float64(floor.cpu.Microseconds())), "floor-cpu-us/event")
	b.ReportMetric(router.perEvent(float64(router.cpu.Microseconds())), "router-cpu-us/event")
	b.ReportMetric(0, "ns/op")
}

// drainCost sums what drains cost.
type drainCost struct {
	events  int
	elapsed time.Duration
	calls   map[string]int64
	usec    int64
	cpu     time.Duration
}

func (c *drainCost) add(d drainCost) {
	if c.calls == nil {
		c.calls = map[string]int64{}
	}
	c.events += d.events
	c.elapsed += d.elapsed
	c.usec += d.usec
	c.cpu += d.cpu
	for k, v := range d.calls {
		c.calls[k] += v
	}
}

func (c *drainCost) total() float64 {
	var n int64
	for _, v := range c.calls {
		n += v
	}
	return float64(n)
}

func (c *drainCost) rate() float64              { return float64(c.events) / c.elapsed.Seconds() }
func (c *drainCost) perEvent(v float64) float64 { return v / float64(c.events) }

// measureDrain publishes drainEvents triage events under the namespace ns, then times
// drain until they are all handled and acked, with the server's commandstats and CPU
// deltas (the benchmark's own INFO left out).
func measureDrain(b *testing.B, rdb *redis.Client, ns string, drain func(context.Context, *testing.B, *redis.Client, string)) drainCost {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := event.Topology{Namespace: ns}.Stream("triage", "", false)
	if err := rdb.XGroupCreateMkStream(ctx, stream, "triage", "0").Err(); err != nil {
		b.Fatal(err)
	}
	pipe := rdb.Pipeline()
	for i := 1; i <= drainEvents; i++ {
		key := "RHEL-" + strconv.Itoa(i)
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
		msg, _ := event.New(event.TriageRequested, key, task, nil)
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)})
		if pipe.Len() == 500 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	calls0, usec0 := commandStats(ctx, b, rdb)
	cpu0 := redisCPU(ctx, b, rdb)
	start := time.Now()
	drain(ctx, b, rdb, ns)
	for rdb.XPending(ctx, stream, "triage").Val().Count > 0 {
		if time.Since(start) > 5*time.Minute {
			b.Fatal("events not acked")
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu1 := redisCPU(ctx, b, rdb)
	calls1, usec1 := commandStats(ctx, b, rdb)
	d := drainCost{events: drainEvents, elapsed: elapsed, calls: map[string]int64{}, usec: usec1 - usec0, cpu: cpu1 - cpu0}
	for name, n := range calls1 {
		if n -= calls0[name]; name == "info" {
			n -= 3 // the INFO cpu and commandstats above
		}
		if name == "xpending" {
			continue // the wait for the last acks above
		}
		if n > 0 {
			d.calls[name] = n
		}
	}
	return d
}

// measureBeside runs DRAIN_BESIDE's drain of drainEvents tasks (see
// BenchmarkDrainBesideFloor) with the server's commandstats and CPU deltas around it;
// the rate is from the time the program reports (its own start left out).
func measureBeside(b *testing.B, rdb *redis.Client, addr, prog string) drainCost {
	ctx := context.Background()
	n := strconv.Itoa(drainEvents)
	if out, err := exec.Command(prog, "enqueue", addr, n).CombinedOutput(); err != nil {
		b.Fatalf("%s enqueue: %v\n%s", prog, err, out)
	}
	conc := strconv.Itoa(drainConcurrency(b))
	calls0, usec0 := commandStats(ctx, b, rdb)
	cpu0 := redisCPU(ctx, b, rdb)
	out, err := exec.Command(prog, "drain", addr, n, conc).Output()
	if err != nil {
		b.Fatalf("%s drain: %v", prog, err)
	}
	cpu1 := redisCPU(ctx, b, rdb)
	calls1, usec1 := commandStats(ctx, b, rdb)
	ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		b.Fatalf("%s drain printed %q, not nanoseconds", prog, out)
	}
	d := drainCost{events: drainEvents, elapsed: time.Duration(ns), calls: map[string]int64{}, usec: usec1 - usec0, cpu: cpu1 - cpu0}
	for name, c := range calls1 {
		if c -= calls0[name]; name == "info" {
			c -= 3 // the INFO commandstats and the two INFO cpu above
		}
		if c > 0 {
			d.calls[name] = c
		}
	}
	return d
}

// drainFloor is the floor: a raw go-redis consumer, XREADGROUP COUNT 100, then one
// XACK for the batch, no handler work.
func drainFloor(ctx context.Context, b *testing.B, rdb *redis.Client, ns string) {
	stream := event.Topology{Namespace: ns}.Stream("triage", "", false)
	for done := 0; done < drainEvents; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "floor",
			Streams: []string{stream, ">"}, Count: 100, Block: 100 * time.Millisecond}).Result()
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]string, 0, 100)
		for _, m := range res[0].Messages {
			ids = append(ids, m.ID)
		}
		if err := rdb.XAck(ctx, stream, "triage", ids...).Err(); err != nil {
			b.Fatal(err)
		}
		done += len(ids)
	}
}

// drainRouter runs drainConcurrency() routers (NewRouter, one subscription per input
// stream, the defaults; each a consumer of its own, as that many workers would be)
// until they have handled drainEvents events between them.
func drainRouter(ctx context.Context, b *testing.B, rdb *redis.Client, url, ns string) {
	opts, _ := ClientOptions(url)
	locker, err := lease.New(rdb, lease.Options{Scope: ns})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	handler := func(*message.Message) error {
		if n.Add(1) == drainEvents {
			close(done)
		}
		return nil
	}
	rctx, stop := context.WithCancel(ctx)
	var stopped sync.WaitGroup
	for i := range drainConcurrency(b) {
		cfg := RouterConfig{Client: rdb, ClientOptions: opts, Topology: event.Topology{Namespace: ns}, Agent: "triage",
			Consumer: "drain-" + strconv.Itoa(i), BlockTime: 100 * time.Millisecond, Locker: locker, Handler: handler}
		if os.Getenv("DRAIN_PAUSES") != "" {
			cfg.Pauses = locker.Pauses() // as every worker: each event's pause check
		}
		r, err := NewRouter(cfg)
		if err != nil {
			b.Fatal(err)
		}
		stopped.Add(1)
		go func() { defer stopped.Done(); _ = r.Run(rctx) }()
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatal("events not consumed")
	}
	// The last acks go out before the routers stop (measureDrain waits for them).
	for rdb.XPending(ctx, event.Topology{Namespace: ns}.Stream("triage", "", false), "triage").Val().Count > 0 {
		time.Sleep(time.Millisecond)
	}
	stop()
	stopped.Wait()
}

// drainConcurrency is DRAIN_CONCURRENCY (default 1): how many routers drain at once,
// and the concurrency DRAIN_BESIDE's drain is given, so both sides compare at equal
// concurrency.
func drainConcurrency(b *testing.B) int {
	v := os.Getenv("DRAIN_CONCURRENCY")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("DRAIN_CONCURRENCY=%q: want a whole number of at least 1", v)
	}
	return n
}

// commandStats is the server's calls per command and the usec of all (INFO
// commandstats).
func commandStats(ctx context.Context, b *testing.B, rdb *redis.Client) (map[string]int64, int64) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	calls := map[string]int64{}
	var usec int64
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls[name], _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				u, _ := strconv.ParseInt(v, 10, 64)
				usec += u
			}
		}
	}
	return calls, usec
}
