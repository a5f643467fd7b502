package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// publishTodo appends a triage request for key to the :todo twin, which the triage
// routers read with subscriptions of their own: an event there meets a run of the
// main stream's subscription while it goes on (one in that subscription's read-ahead
// would wait for the run to end).
func publishTodo(t *testing.T, e *env, key string) string {
	t.Helper()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := e.Publisher.PublishID(context.Background(), e.Topology.Stream("triage", "", true), msg)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// ledger notes each run of one issue (its start and end) and counts overlaps: the
// runs of one lease must never overlap in wall-clock time.
type ledger struct {
	mu       sync.Mutex
	running  int
	overlaps int
	fences   map[string]int64 // entry id -> fence of its run
	ended    map[string]time.Time
	started  map[string]time.Time
}

func newLedger() *ledger {
	return &ledger{fences: map[string]int64{}, ended: map[string]time.Time{}, started: map[string]time.Time{}}
}

func (l *ledger) start(id string, fence int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running++
	if l.running > 1 {
		l.overlaps++
	}
	l.fences[id], l.started[id] = fence, time.Now()
}

func (l *ledger) end(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	l.ended[id] = time.Now()
}

// supersededRecords returns the lock.superseded records by the entry they end.
func supersededRecords(e *env) map[string]redis.XMessage {
	out := map[string]redis.XMessage{}
	for _, m := range e.results(event.LockSuperseded) {
		out[m.Values["message_id"].(string)] = m
	}
	return out
}

// Issue 23, supersede: a newer event for an issue whose run goes on in another
// consumer cancels it at once (the announcement, not the heartbeat ten seconds away):
// the old handler's context ends with ErrSuperseded (and ErrLeaseLost), its fenced
// write after the cancel is refused, it is recorded as lock.superseded naming the newer
// entry and acked; the newer event runs once, with a higher fence, only after the old
// run has returned. Then three events in a row: the middle one is superseded too.
func TestSupersedeCancelsTheRunningEvent(t *testing.T) {
	// Not parallel: it bounds how soon the old run is cancelled (a latency).
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &supersedeWorld{t: t, e: e, ctx: ctx, results: event.NewResults(e.rdb, e.topo.Results(), 0), led: newLedger(),
		cancels: make(chan cancelled, 4)}
	o := routerOpts{TTL: 30 * time.Second, MaxIdle: 20 * time.Second, Policy: lockmw.Supersede}
	o.Consumer = "w1"
	e.start(ctx, o, w.handle)
	o.Consumer = "w2"
	e.start(ctx, o, w.handle)
	w.twoEvents()
	w.threeEvents()
}

// cancelled is what a graced run saw when it was cancelled: its context's cause, its
// late fenced write's error, and when.
type cancelled struct {
	cause, late error
	after       time.Time
}

// supersedeWorld is the two consumers of TestSupersedeCancelsTheRunningEvent and what
// their handler (handle) records.
type supersedeWorld struct {
	t       *testing.T
	e       *env
	ctx     context.Context
	results *event.Results
	led     *ledger
	cancels chan cancelled
	grace   sync.Map // entry id -> how long its run goes on after the cancel (an agent's kill grace)
	// registering: graced publishes and notes its entry's grace before any handler can
	// look it up: under load a handler may start before publish has returned.
	registering sync.Mutex
}

// graced publishes with publish and notes its entry's grace g.
func (w *supersedeWorld) graced(publish func() string, g time.Duration) string {
	w.registering.Lock()
	defer w.registering.Unlock()
	id := publish()
	w.grace.Store(id, g)
	return id
}

// handle runs a graced entry until it is cancelled (then its grace, then a late write),
// and records any other entry done.
func (w *supersedeWorld) handle(msg *message.Message) error {
	e := w.e
	le, _ := lockmw.LeaseFrom(msg.Context())
	id := event.EntryID(msg)
	w.led.start(id, le.Fence())
	defer w.led.end(id)
	w.registering.Lock()
	g, ok := w.grace.Load(id)
	w.registering.Unlock()
	if ok {
		<-msg.Context().Done()
		at := time.Now()
		time.Sleep(g.(time.Duration))
		_, late := le.XAdd(context.Background(), e.topo.Results(), 0, map[string]any{"event_type": "late.write", "message_id": id})
		w.cancels <- cancelled{cause: context.Cause(msg.Context()), late: late, after: at}
		return msg.Context().Err()
	}
	_, err := w.results.Add(msg.Context(), event.Record{EventType: event.StageDone, Agent: "triage",
		IssueKey: issueOf(msg), MessageID: id, Stream: event.EntryStream(msg)})
	return err
}

// twoEvents: the first runs until the second supersedes it; it is cancelled within 1 s,
// its late write refused, it is recorded superseded, and the second runs after it.
func (w *supersedeWorld) twoEvents() {
	t, e := w.t, w.e
	// Two events: the first runs until cancelw.led.
	first := w.graced(func() string { return e.publishTriage("RHEL-1") }, 200*time.Millisecond)
	redistest.Eventually(t, 10*time.Second, func() bool { w.led.mu.Lock(); defer w.led.mu.Unlock(); return w.led.running == 1 }, "the first run started")
	sent := time.Now()
	second := publishTodo(t, e, "RHEL-1")
	var c cancelled
	select {
	case c = <-w.cancels:
	case <-time.After(5 * time.Second):
		t.Fatal("the running event was not cancelled within 5s (its heartbeat is 10s away)")
	}
	if d := c.after.Sub(sent); d > time.Second {
		t.Errorf("the old run was cancelled %s after the newer event was published, want within 1s", d)
	}
	var by *lease.SupersededByError
	if !errors.Is(c.cause, lockmw.ErrSuperseded) || !errors.Is(c.cause, lease.ErrLeaseLost) || !errors.As(c.cause, &by) || by.ByMessageID != second {
		t.Fatalf("cause %v, want ErrSuperseded naming %s", c.cause, second)
	}
	if !errors.Is(c.late, lease.ErrLeaseLost) {
		t.Fatalf("the superseded run's late write: %v, want refused", c.late)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return len(e.results(event.StageDone)) == 1 && len(supersededRecords(e)) == 1 &&
			e.pending(e.triage()) == 0 && e.pending(e.Topology.Stream("triage", "", true)) == 0
	}, "the newer event ran and the older one was recorded")
	rec := supersededRecords(e)[first]
	if rec.Values["holder_message_id"] != second || rec.Values["cancelled"] != "true" || rec.Values["ran"] != "true" || rec.Values["reason"] != "superseded" {
		t.Fatalf("lock.superseded record %v, want it to name %s, cancelled", rec.Values, second)
	}
	if done := e.results(event.StageDone)[0]; done.Values["message_id"] != second {
		t.Fatalf("the run that finished was %v, want %s", done.Values["message_id"], second)
	}
	w.led.mu.Lock()
	if w.led.fences[second] <= w.led.fences[first] || w.led.overlaps != 0 || w.led.started[second].Before(w.led.ended[first]) {
		t.Errorf("fences %v, overlaps %d; the newer run started %s after the older one ended", w.led.fences, w.led.overlaps,
			w.led.started[second].Sub(w.led.ended[first]))
	}
	w.led.mu.Unlock()
	if n := len(e.results("late.write")); n != 0 {
		t.Fatalf("%d late writes landed", n)
	}
}

// threeEvents: the first runs, the second supersedes it and waits for it to stop (its
// grace), the third supersedes the second; only the third runs to the end.
func (w *supersedeWorld) threeEvents() {
	t, e, ctx := w.t, w.e, w.ctx
	// Three events: the first runs, the second supersedes it and waits for it to stop
	// (its grace), the third supersedes the second.
	a := w.graced(func() string { return e.publishTriage("RHEL-2") }, time.Second)
	redistest.Eventually(t, 10*time.Second, func() bool { w.led.mu.Lock(); defer w.led.mu.Unlock(); return w.led.fences[a] != 0 }, "the first run started")
	b := w.graced(func() string { return publishTodo(t, e, "RHEL-2") }, 200*time.Millisecond) // should it run before the third comes
	info := e.TriageLocker(30*time.Second).Keys("triage", "RHEL-2").Info
	redistest.Eventually(t, 5*time.Second, func() bool { return e.rdb.HGet(ctx, info, "message_id").Val() == b }, "the second event took the lease over")
	c3 := e.publishTriage("RHEL-2")
	redistest.Eventually(t, 15*time.Second, func() bool {
		sup := supersededRecords(e)
		return sup[a].ID != "" && sup[b].ID != "" && len(e.results(event.StageDone)) == 2 &&
			e.pending(e.triage()) == 0 && e.pending(e.Topology.Stream("triage", "", true)) == 0
	}, "the newest ran, the two before it were superseded")
	sup := supersededRecords(e)
	if sup[a].Values["holder_message_id"] != b || sup[b].Values["holder_message_id"] != c3 {
		t.Fatalf("superseded records %v / %v, want %s by %s, %s by %s", sup[a].Values, sup[b].Values, a, b, b, c3)
	}
	if done := e.results(event.StageDone)[1]; done.Values["message_id"] != c3 {
		t.Fatalf("the run that finished was %v, want the newest %s", done.Values["message_id"], c3)
	}
	w.led.mu.Lock()
	defer w.led.mu.Unlock()
	if w.led.overlaps != 0 || (w.led.fences[c3] <= w.led.fences[b] && w.led.fences[b] != 0) || w.led.fences[c3] <= w.led.fences[a] {
		t.Errorf("overlaps %d, fences %v", w.led.overlaps, w.led.fences)
	}
}

// The superseded holder's process is dead (SIGKILLed: nobody cancels its run, releases
// its lease or acks its entry): the newer event still runs, once the old lease would
// have expired, and nothing is lost: the old entry, claimed from the dead consumer, is
// recorded once as lock.superseded naming the newer entry, the newer has its outcome.
func TestSupersedeOfADeadWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ttl = 2 * time.Second
	// The dead worker: it read the first event as consumer "dead" and took its lease,
	// then vanished (its Locker never releases; its heartbeat finds the key taken).
	first := e.publishTriage("RHEL-3")
	if err := e.rdb.XGroupCreateMkStream(ctx, e.triage(), "triage", "0").Err(); err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "dead", Streams: []string{e.triage(), ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	dead := e.Locker(lease.Options{Scope: e.Namespace, TTL: ttl, Owner: "dead"})
	if _, err := dead.Acquire(ctx, "triage", "RHEL-3", lease.AcquireOptions{MessageID: first, Supersede: true, Owner: "dead"}); err != nil {
		t.Fatal(err)
	}
	took := time.Now()

	results := event.NewResults(e.rdb, e.topo.Results(), 0)
	var ran sync.Map
	e.start(ctx, routerOpts{TTL: ttl, MaxIdle: time.Second, Policy: lockmw.Supersede, Consumer: "w1"}, func(msg *message.Message) error {
		ran.Store(event.EntryID(msg), time.Now())
		_, err := results.Add(msg.Context(), event.Record{EventType: event.StageDone, Agent: "triage",
			IssueKey: issueOf(msg), MessageID: event.EntryID(msg), Stream: event.EntryStream(msg)})
		return err
	})
	published := time.Now()
	second := publishTodo(t, e, "RHEL-3")
	redistest.Eventually(t, 15*time.Second, func() bool {
		return len(e.results(event.StageDone)) == 1 && len(supersededRecords(e)) == 1 &&
			e.pending(e.triage()) == 0 && e.pending(e.Topology.Stream("triage", "", true)) == 0
	}, "the newer event ran and the dead worker's event was recorded")
	if done := e.results(event.StageDone)[0]; done.Values["message_id"] != second {
		t.Fatalf("outcome of %v, want the newer %s", done.Values["message_id"], second)
	}
	if rec := supersededRecords(e)[first]; rec.Values["holder_message_id"] != second {
		t.Fatalf("lock.superseded %v, want %s superseded by %s", rec.Values, first, second)
	}
	if _, again := ran.Load(first); again {
		t.Fatal("the dead worker's superseded event ran again")
	}
	// The dead run may be alive for all anyone knows until its key would have expired
	// (at least 2/3 of the TTL after the take-over: its heartbeat extended it every
	// TTL/3 until then): the newer run does not start before.
	at, _ := ran.Load(second)
	if waited := at.(time.Time).Sub(took); waited > 2*ttl {
		t.Fatalf("the newer event ran %s after the dead holder's lease was taken, want within its TTL (%s) and a little", waited, ttl)
	}
	if early := at.(time.Time).Sub(published); early < ttl/2 {
		t.Fatalf("the newer event ran %s after it was published, before the dead holder's key could have expired", early)
	}
}

// As after a force release (issue 29), no attempt starts under a superseded lease: a
// run whose attempt fails just after a newer event took the issue over is not retried
// (the in-lease retry checks the lease first); it is recorded as superseded, and only
// the newer event runs after it.
func TestSupersedeStartsNoFurtherAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := event.NewResults(e.rdb, e.topo.Results(), 0)
	var mu sync.Mutex
	attempts := map[string]int{}
	info := e.TriageLocker(30*time.Second).Keys("triage", "RHEL-4").Info
	var first string
	e.start(ctx, routerOpts{TTL: 30 * time.Second, MaxIdle: 20 * time.Second, MaxRetries: 3, Policy: lockmw.Supersede, Concurrency: 1},
		func(msg *message.Message) error {
			id := event.EntryID(msg)
			mu.Lock()
			attempts[id]++
			isFirst := id == first
			mu.Unlock()
			if isFirst {
				// Fail once the newer event holds the issue: the retry must not try again.
				redistest.Eventually(t, 10*time.Second, func() bool {
					m := e.rdb.HGet(context.Background(), info, "message_id").Val()
					return m != "" && m != first
				}, "the newer event took the issue over")
				return errBoom
			}
			_, err := results.Add(msg.Context(), event.Record{EventType: event.StageDone, Agent: "triage",
				IssueKey: issueOf(msg), MessageID: id, Stream: event.EntryStream(msg)})
			return err
		})
	mu.Lock()
	first = e.publishTriage("RHEL-4")
	mu.Unlock()
	redistest.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return attempts[first] == 1 }, "the first attempt started")
	second := publishTodo(t, e, "RHEL-4")
	redistest.Eventually(t, 15*time.Second, func() bool {
		return len(e.results(event.StageDone)) == 1 && len(supersededRecords(e)) == 1 &&
			e.pending(e.triage()) == 0 && e.pending(e.Topology.Stream("triage", "", true)) == 0
	}, "the newer event ran and the older was recorded")
	mu.Lock()
	defer mu.Unlock()
	if attempts[first] != 1 || attempts[second] != 1 {
		t.Fatalf("attempts %v: want one each (none after the take-over)", attempts)
	}
	if rec := supersededRecords(e)[first]; rec.Values["holder_message_id"] != second {
		t.Fatalf("lock.superseded %v, want it to name %s", rec.Values, second)
	}
	if len(e.dead()) != 0 {
		t.Fatal("the superseded event was dead-lettered")
	}
}

// A newer event read ahead by the very subscription whose handler runs the issue (one
// worker, one subscription per stream) would wait behind the run and never meet the
// lease: under supersede it cancels the run all the same, is recorded as superseding
// it, and runs right after.
func TestSupersedeFromTheHoldersOwnReadAhead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := startFirstHeld(ctx, t, e, nil)
	second := e.publishTriage("RHEL-5")
	redistest.Eventually(t, 10*time.Second, func() bool {
		return len(e.results(event.StageDone)) == 1 && len(supersededRecords(e)) == 1 && e.pending(e.triage()) == 0
	}, "the read-ahead newer event cancelled the run and ran")
	if rec := supersededRecords(e)[first]; rec.Values["holder_message_id"] != second || rec.Values["cancelled"] != "true" {
		t.Fatalf("lock.superseded %v, want it to name %s", rec.Values, second)
	}
	if done := e.results(event.StageDone)[0]; done.Values["message_id"] != second {
		t.Fatalf("outcome of %v, want %s", done.Values["message_id"], second)
	}
}

// startFirstHeld starts e's router under supersede with a handler that runs RHEL-5's
// first event through hold and records stage.done for every other event (and for the
// first when hold returns nil). hold nil holds the run until it is cancelled. It
// publishes that first event and returns its id once it runs.
func startFirstHeld(ctx context.Context, t *testing.T, e *env, hold func(msg *message.Message) error) string {
	t.Helper()
	if hold == nil {
		hold = func(msg *message.Message) error {
			<-msg.Context().Done()
			return context.Cause(msg.Context())
		}
	}
	results := event.NewResults(e.rdb, e.topo.Results(), 0)
	var mu sync.Mutex
	var first string
	e.start(ctx, routerOpts{TTL: 30 * time.Second, MaxIdle: 20 * time.Second, Policy: lockmw.Supersede}, func(msg *message.Message) error {
		mu.Lock()
		isFirst := event.EntryID(msg) == first
		mu.Unlock()
		if isFirst {
			if err := hold(msg); err != nil {
				return err
			}
		}
		_, err := results.Add(msg.Context(), event.Record{EventType: event.StageDone, Agent: "triage",
			IssueKey: issueOf(msg), MessageID: event.EntryID(msg), Stream: event.EntryStream(msg)})
		return err
	})
	mu.Lock()
	first = e.publishTriage("RHEL-5")
	mu.Unlock()
	redistest.Eventually(t, 10*time.Second, func() bool { return e.pending(e.triage()) == 1 }, "the first event runs")
	return first
}
