package pipeline_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// The read batching of the subscription: Watermill asks for one entry per XREADGROUP;
// while a subscription keeps up with a backlog it reads up to ReadBatch at once.

// xreadgroupCalls is the number of XREADGROUP the env's server has run (a private
// server: the shared one counts every test's).
func xreadgroupCalls(t *testing.T, e *env) int64 {
	t.Helper()
	info, err := e.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_xreadgroup:calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			v, _ := strconv.ParseInt(n, 10, 64)
			return v
		}
	}
	return 0
}

// backlog publishes n triage events (keys RHEL-1..n) and returns their keys in stream
// order.
func (e *env) backlog(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "RHEL-" + strconv.Itoa(i+1)
		e.publishTriage(keys[i])
	}
	return keys
}

// orderLog records the keys a handler saw, in order.
type orderLog struct {
	mu   sync.Mutex
	keys []string
}

func (o *orderLog) add(k string) { o.mu.Lock(); o.keys = append(o.keys, k); o.mu.Unlock() }
func (o *orderLog) count() int   { o.mu.Lock(); defer o.mu.Unlock(); return len(o.keys) }
func (o *orderLog) all() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.keys...)
}

// A backlog drained by a fast handler costs far fewer reads than events, every event
// runs once, in stream order, and nothing is left pending.
func TestBatchedReadsDrainBacklogInOrder(t *testing.T) {
	// Not parallel: it runs on its own redis-server, a process of its own; started beside other tests on a 2-core CI machine, server start-ups make the timed reads of the others late.
	e := newEnvOn(t, redistest.StartServer(t, redistest.ServerOptions{}))
	const n = 300
	keys := e.backlog(n)
	var seen orderLog
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := xreadgroupCalls(t, e)
	e.start(ctx, routerOpts{}, func(msg *message.Message) error { seen.add(issueOf(msg)); return nil })
	redistest.Eventually(t, 30*time.Second, func() bool { return seen.count() >= n }, "%d events handled", n)
	reads := xreadgroupCalls(t, e) - before
	if got := seen.all(); strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Fatalf("handled %d events, not each once in stream order:\n got %v\nwant %v", len(got), got, keys)
	}
	// One read per entry would be n (plus idle polls); batches of 8 need about n/8.
	if reads > n/3 {
		t.Errorf("%d XREADGROUP for %d events: reads are not batched", reads, n)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "no entry pending")
	t.Logf("%d events, %d XREADGROUP", n, reads)
}

// READ_BATCH=1 keeps Watermill's one entry per read.
func TestReadBatchOneReadsEachEntry(t *testing.T) {
	// Not parallel: it runs on its own redis-server, a process of its own; started beside other tests on a 2-core CI machine, server start-ups make the timed reads of the others late.
	e := newEnvOn(t, redistest.StartServer(t, redistest.ServerOptions{}))
	const n = 60
	e.backlog(n)
	var seen orderLog
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := xreadgroupCalls(t, e)
	cfg := e.Config("triage", "", "w1", e.locker(3*time.Second), func(msg *message.Message) error { seen.add(issueOf(msg)); return nil })
	cfg.ReadBatch = 1
	e.Start(ctx, cfg)
	redistest.Eventually(t, 30*time.Second, func() bool { return seen.count() >= n }, "%d events handled", n)
	if reads := xreadgroupCalls(t, e) - before; reads < n {
		t.Errorf("READ_BATCH=1: %d XREADGROUP for %d events, want one per event", reads, n)
	}
}

// A slow handler keeps reads at one entry: no batch waits here behind a long run while
// other consumers could take it. The consumer never holds more than the handled entry
// and Watermill's two read ahead.
func TestSlowHandlerDoesNotBatch(t *testing.T) {
	// Not parallel: it times a slow handler against the read batch; other tests' CPU would blur the timing.
	e := newEnv(t)
	const n = 12
	e.backlog(n)
	var seen orderLog
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.start(ctx, routerOpts{}, func(msg *message.Message) error {
		seen.add(issueOf(msg))
		time.Sleep(40 * time.Millisecond) // the point: a handler slower than fastHandling
		return nil
	})
	most := int64(0)
	for seen.count() < n {
		most = max(most, e.pending(e.triage()))
		time.Sleep(5 * time.Millisecond) // sampling the pending count while events run
	}
	if most > 3 {
		t.Errorf("a slow handler's consumer held %d entries pending, want at most 3 (1 running + 2 read ahead)", most)
	}
}

// Two consumers batching on one stream: every event runs exactly once, none is lost.
func TestBatchedConsumersRunEachEventOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 400
	keys := e.backlog(n)
	var r runs
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := func(msg *message.Message) error { r.Add(issueOf(msg)); return nil }
	e.start(ctx, routerOpts{Consumer: "w1"}, h)
	e.start(ctx, routerOpts{Consumer: "w2"}, h)
	total := func() int {
		s := 0
		for _, v := range r.Snapshot() {
			s += v
		}
		return s
	}
	redistest.Eventually(t, 60*time.Second, func() bool { return total() >= n }, "%d events handled", n)
	redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "no entry pending")
	for _, k := range keys {
		if got := r.Get(k); got != 1 {
			t.Errorf("%s ran %d times, want 1", k, got)
		}
	}
}

// Entries a batch read but the router never handed over (it stopped) stay pending for
// this consumer, and the next run under the same name takes them at once: none lost.
func TestBatchedEntriesSurviveRestart(t *testing.T) {
	// Not parallel: it restarts its own redis-server and waits for the entries to come back within a bound.
	e := newEnv(t)
	const n = 200
	keys := e.backlog(n)
	var r runs
	var handled atomic.Int64
	ctx1, stop := context.WithCancel(context.Background())
	twentieth := make(chan struct{})
	_, done := e.start(ctx1, routerOpts{MaxIdle: time.Minute}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		if handled.Add(1) == 20 {
			// Stop in the middle of the backlog, with a batch read ahead.
			close(twentieth)
			<-msg.Context().Done()
			return msg.Context().Err()
		}
		return nil
	})
	<-twentieth
	stop()
	if err := <-done; err != nil {
		t.Fatalf("first run: %v", err)
	}
	if p := e.pending(e.triage()); p < 2 {
		t.Fatalf("%d entries pending after the first run, want the stopped one and those read ahead", p)
	}
	ctx2, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.start(ctx2, routerOpts{MaxIdle: time.Minute}, func(msg *message.Message) error { r.Add(issueOf(msg)); return nil })
	redistest.Eventually(t, 30*time.Second, func() bool { return len(r.Snapshot()) == n }, "every event handled")
	redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "no entry pending")
	for _, k := range keys {
		if r.Get(k) == 0 {
			t.Errorf("%s lost", k)
		}
	}
}

// Quick events, then a long one: the entries a batch read with it are handed back to
// the group after about a second, and another consumer runs them while the long one
// goes on, instead of after it (or after MAX_IDLE_TIME). Only Watermill's own two
// read-ahead entries wait for the long event.
func TestBatchBehindALongEventIsHandedBack(t *testing.T) {
	// Not parallel: it waits out claim idle times and heartbeats, timed against the lease's TTL.
	e := newEnv(t)
	const n, slow = 40, "RHEL-12"
	e.backlog(n)
	var r runs
	var handled atomic.Int64
	slowStarted, slowDone := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// MAX_IDLE_TIME far beyond the test: only the hand-back can move the entries.
	e.start(ctx, routerOpts{Consumer: "w1", MaxIdle: time.Minute}, func(msg *message.Message) error {
		if issueOf(msg) == slow {
			close(slowStarted)
			<-slowDone // the long run, released by the test
		}
		r.Add(issueOf(msg))
		handled.Add(1)
		return nil
	})
	<-slowStarted
	e.start(ctx, routerOpts{Consumer: "w2", MaxIdle: time.Minute}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		handled.Add(1)
		return nil
	})
	// All but the long event and Watermill's two read ahead behind it get handled while
	// it runs.
	redistest.Eventually(t, 20*time.Second, func() bool { return handled.Load() >= n-3 },
		"all but the long event and two read-ahead entries handled while it runs")
	close(slowDone)
	redistest.Eventually(t, 20*time.Second, func() bool { return handled.Load() >= n }, "every event handled")
	redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "no entry pending")
	for k, v := range r.Snapshot() {
		if v != 1 {
			t.Errorf("%s ran %d times, want 1", k, v)
		}
	}
}
