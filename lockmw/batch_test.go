package lockmw_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// queueSource is a lockmw.Source over entries read ahead, as a subscription is: it
// hands them over in order (Entry takes the next), names the next one (Peek) and lists
// those that wait (Waiting), so the middleware ends quick runs in batches.
type queueSource struct {
	stream  string
	mu      sync.Mutex
	queue   []lockmw.Waiting
	settled map[string]bool
}

func (q *queueSource) Entry(*message.Message) (lockmw.Entry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.queue[0]
	q.queue = q.queue[1:]
	return lockmw.Entry{Stream: q.stream, Group: "g", Consumer: "c", ID: w.ID, ReadAt: time.Now()}, true
}

func (q *queueSource) Settle(e lockmw.Entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.settled[e.ID] = true
}

func (q *queueSource) Encode(m *message.Message) (map[string]any, error) {
	return map[string]any{"payload": string(m.Payload)}, nil
}

func (q *queueSource) Peek() (string, string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		return "", "", false
	}
	return q.queue[0].ID, q.queue[0].IssueKey, true
}

func (q *queueSource) Waiting() []lockmw.Waiting {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]lockmw.Waiting(nil), q.queue...)
}

// cmdCounter counts the round trips a client sends with a command match takes: alone,
// or anywhere in a pipeline (one round trip).
type cmdCounter struct {
	match func(redis.Cmder) bool
	n     atomic.Int64
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.match(cmd) {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, c.match) {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// isScript matches the scripts (EVALSHA and EVAL): the lease's round trips.
func isScript(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

// batchEnv is a middleware whose source holds entries of the given issues, read into
// group g for consumer c, and whose locker's client counts its scripts.
type batchEnv struct {
	rdb     *redis.Client
	ns      string
	l       *lease.Locker
	src     *queueSource
	mw      *lockmw.Middleware
	scripts *cmdCounter
	ids     []string
}

func newBatchEnv(t *testing.T, issues ...string) *batchEnv {
	t.Helper()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	counted := redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = counted.Close() })
	e := &batchEnv{rdb: rdb, ns: ns, l: locker(t, counted, ns), scripts: &cmdCounter{match: isScript}}
	counted.AddHook(e.scripts)
	e.src = &queueSource{stream: ns + "s", settled: map[string]bool{}}
	rdb.XGroupCreateMkStream(ctx, e.src.stream, "g", "$")
	for _, issue := range issues {
		id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.src.stream, Values: map[string]any{"payload": "{}"}}).Val()
		e.ids = append(e.ids, id)
		e.src.queue = append(e.src.queue, lockmw.Waiting{ID: id, IssueKey: issue})
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{e.src.stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	mw, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: e.l, Agent: "triage", Source: e.src,
		MaxIdleTime: time.Hour, OnConflict: recordTo(ns + "results")})
	if err != nil {
		t.Fatal(err)
	}
	e.mw = mw
	return e
}

// run hands every entry to the middleware in order, with a handler that records the
// issues it ran.
func (e *batchEnv) run(t *testing.T) []string {
	t.Helper()
	var ran []string
	h := e.mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		ran = append(ran, msg.Metadata.Get("issue_key"))
		return nil, nil
	})
	for len(e.src.Waiting()) > 0 {
		issue := e.src.Waiting()[0].IssueKey
		if _, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"`+issue+`"}}`))); err != nil {
			t.Fatal(err)
		}
	}
	return ran
}

// settledAll waits until no entry is pending and no lease key of the test is left.
func (e *batchEnv) settledAll(t *testing.T) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool {
		locks := e.rdb.Keys(context.Background(), "lock:"+e.ns+"triage:*").Val()
		return e.rdb.XPending(context.Background(), e.src.stream, "g").Val().Count == 0 && len(locks) == 0
	}, "every entry acked and every lease released")
}

// A burst of quick runs costs one round trip per batch, not one per event: every event
// runs, every entry is acked after its release, and no lease is left.
func TestQuickRunsEndInBatches(t *testing.T) {
	t.Parallel()
	issues := rhel(24)
	e := newBatchEnv(t, issues...)
	ran := e.run(t)
	if len(ran) != len(issues) {
		t.Fatalf("ran %d events, want %d", len(ran), len(issues))
	}
	e.settledAll(t)
	if n := e.scripts.n.Load(); n > int64(len(issues))/4 {
		t.Fatalf("%d scripts for %d quick events, want at most %d (batches)", n, len(issues), len(issues)/4)
	}
	for _, id := range e.ids {
		if !e.src.settled[id] {
			t.Errorf("entry %s not settled: the subscriber would ack it a second time", id)
		}
	}
}

// An issue that another holder has is met in the batch that takes the leases ahead:
// its event is dropped and recorded, the others run, and a later event of an issue
// taken ahead is not taken in the same batch (its lease comes after that run's end).
func TestBatchMeetsBusyIssueAndKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "RHEL-1", "RHEL-2", "RHEL-9", "RHEL-3", "RHEL-2")
	holder, err := e.l.Acquire(context.Background(), "triage", "RHEL-9", lease.AcquireOptions{Owner: "holder", MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	// The runs end in a later millisecond than the entries entered (the superseded
	// check compares milliseconds).
	last, _, _ := strings.Cut(e.ids[len(e.ids)-1], "-")
	redistest.Eventually(t, time.Second, func() bool {
		now := e.rdb.Time(context.Background()).Val().UnixMilli()
		return strconv.FormatInt(now, 10) > last
	}, "the server clock to pass the entries' millisecond")
	ran := e.run(t)
	// The second RHEL-2 entered before the first one's run ended: superseded, dropped,
	// as one event after the other would find it.
	if got := strings.Join(ran, ","); got != "RHEL-1,RHEL-2,RHEL-3" {
		t.Fatalf("ran %s, want RHEL-1,RHEL-2,RHEL-3", got)
	}
	if _, err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.settledAll(t)
	recs := e.rdb.XRange(context.Background(), e.ns+"results", "-", "+").Val()
	if len(recs) != 2 || recs[0].Values["issue_key"] != "RHEL-9" || recs[0].Values["holder"] != "holder" ||
		recs[1].Values["issue_key"] != "RHEL-2" || recs[1].Values["superseded"] != "1" {
		t.Fatalf("conflict records = %v, want RHEL-9 held by holder, then RHEL-2 superseded", recs)
	}
}

// Ends that wait for their batch when Redis cannot be reached are retried and logged
// (endLater) by the timer's send or Close's, which have no event's message: the log
// must not need one (it dereferenced a nil message, and the worker panicked).
func TestWaitingEndsFailWithoutAMessage(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "RHEL-1")
	e.mw.SetBatchTiming(time.Hour, time.Hour) // the end waits until Close
	if ran := e.run(t); len(ran) != 1 {
		t.Fatalf("ran %v, want RHEL-1", ran)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the batch fails, and its retries stop at once
	e.mw.Close(ctx)
	if n := e.rdb.XPending(context.Background(), e.src.stream, "g").Val().Count; n != 1 {
		t.Fatalf("%d entries pending, want 1: the batch that failed must leave its entry pending", n)
	}
	e.mw.Close(context.Background()) // the lease expires by itself; nothing is left to send
}

// An entry that takes its own lease while the timer's batch is in flight waits for
// that batch: its acquire must not overtake the release of a run that ended before
// the entry entered its stream (it would be dropped as locked, where it must run).
func TestEntryWaitsForTheBatchInFlight(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, "RHEL-1")
	inFlight, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.mw.WrapBatchSend(func(send lockmw.BatchSend) lockmw.BatchSend {
		return func(ctx context.Context, ends []lease.End, nexts []lease.Next) ([]*lease.Pending, error) {
			if len(ends) > 0 && len(nexts) == 0 { // the timer's: held until the gate opens
				once.Do(func() { close(inFlight); <-gate })
			}
			return send(ctx, ends, nexts)
		}
	})
	if ran := e.run(t); len(ran) != 1 { // nothing is read after it: its end waits for the timer
		t.Fatalf("ran %v, want RHEL-1", ran)
	}
	ended := time.Now().UnixMilli()
	select {
	case <-inFlight:
	case <-time.After(5 * time.Second):
		t.Fatal("the timer sent no batch")
	}
	ctx := context.Background()
	redistest.Eventually(t, time.Second, func() bool { return e.rdb.Time(ctx).Val().UnixMilli() > ended+1 },
		"the server clock to pass the run's end")
	id := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.src.stream, Values: map[string]any{"payload": "{}"}}).Val()
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{e.src.stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	e.src.mu.Lock()
	e.src.queue = append(e.src.queue, lockmw.Waiting{ID: id, IssueKey: "RHEL-1"})
	e.src.mu.Unlock()
	var ran atomic.Bool
	done := make(chan error, 1)
	go func() {
		h := e.mw.Handler(func(*message.Message) ([]*message.Message, error) { ran.Store(true); return nil, nil })
		_, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-1"}}`)))
		done <- err
	}()
	var err error
	select {
	case err = <-done: // without the wait: the entry met the run's lease at once
		close(gate)
	case <-time.After(50 * time.Millisecond):
		close(gate)
		err = <-done
	}
	if err != nil {
		t.Fatal(err)
	}
	if !ran.Load() {
		t.Fatal("the entry did not run: its acquire overtook the release of the run that ended before it entered")
	}
	e.settledAll(t)
}

// A quick run's end waits for the batch, and the subscriber acks its entry (ending the
// entry's context) before the batch is sent: the lease stays held until the batch
// releases it, and ends released, not cancelled by the ack. (It was untied only at
// the release, so the ack cancelled it first, from a goroutine of its own: one per
// event.)
func TestBatchedEndOutlivesItsEntryContext(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t, rhel(4)...)
	e.mw.SetBatchTiming(time.Hour, time.Hour)
	var leases []*lease.Lease
	h := e.mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		le, ok := lockmw.LeaseFrom(msg.Context())
		if !ok {
			t.Error("no lease in the run's context")
		}
		leases = append(leases, le)
		return nil, nil
	})
	for len(e.src.Waiting()) > 0 {
		issue := e.src.Waiting()[0].IssueKey
		msg := message.NewMessage("u", []byte(`{"metadata":{"issue":"`+issue+`"}}`))
		ctx, ack := context.WithCancel(context.Background())
		msg.SetContext(ctx)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		ack() // as the subscriber does once the handler has acked
	}
	// The first run took its own lease and the others' ahead; the second, third and
	// fourth runs' ends wait for a batch (flushed after an hour, or at Close).
	if len(leases) != 4 {
		t.Fatalf("%d runs, want 4", len(leases))
	}
	if redistest.Within(200*time.Millisecond, func() bool {
		return !leases[1].Held() || !leases[2].Held() || !leases[3].Held()
	}) {
		t.Fatalf("a lease whose end waits for its batch ended when its entry was acked: %v, %v, %v",
			context.Cause(leases[1].Context()), context.Cause(leases[2].Context()), context.Cause(leases[3].Context()))
	}
	e.mw.Close(context.Background())
	e.settledAll(t)
	for i, le := range leases {
		if cause := context.Cause(le.Context()); !errors.Is(cause, lease.ErrReleased) {
			t.Errorf("run %d's lease ended with %v, want %v", i+1, cause, lease.ErrReleased)
		}
	}
}
