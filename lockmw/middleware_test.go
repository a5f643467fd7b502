package lockmw_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
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

// streamSource is a lockmw.Source over one real stream entry, as a subscription sees it.
type streamSource struct {
	entry   lockmw.Entry
	mu      sync.Mutex
	settled int
}

func (s *streamSource) Entry(*message.Message) (lockmw.Entry, bool) { return s.entry, true }
func (s *streamSource) Settle(lockmw.Entry)                         { s.mu.Lock(); s.settled++; s.mu.Unlock() }
func (s *streamSource) Encode(m *message.Message) (map[string]any, error) {
	return map[string]any{"payload": string(m.Payload)}, nil
}

// taskKey reads the issue key from a Task-like payload, as a caller's extractor would.
func taskKey(msg *message.Message) (string, error) {
	var task struct {
		Metadata struct{ Issue string } `json:"metadata"`
	}
	if err := json.Unmarshal(msg.Payload, &task); err != nil || task.Metadata.Issue == "" {
		return "", lockmw.ErrNoIssueKey
	}
	return task.Metadata.Issue, nil
}

// recordTo is a conflict recorder writing to a results stream.
func recordTo(stream string) lockmw.ConflictRecorder {
	return func(ctx context.Context, pipe redis.Pipeliner, c lockmw.Conflict) {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{
			"issue_key": c.Holder.Issue, "message_id": c.Entry.ID, "uuid": c.Message.UUID, "holder": c.Holder.Owner,
			"holder_fence": c.Holder.Fence, "holder_message_id": c.Holder.MessageID,
			"queued": c.Queued, "replaced": c.Replaced, "superseded": c.Superseded}})
	}
}

// exists reports whether key exists.
func exists(t *testing.T, rdb redis.UniversalClient, key string) bool {
	t.Helper()
	n, err := rdb.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// locker returns a Locker with the default options whose keys live in namespace ns.
func locker(t *testing.T, rdb redis.UniversalClient, ns string) *lease.Locker {
	t.Helper()
	l, err := lease.New(rdb, lease.Options{Scope: ns})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func handlerOf(cfg lockmw.Config) (message.HandlerMiddleware, error) {
	m, err := lockmw.NewMiddleware(cfg)
	if err != nil {
		return nil, err
	}
	return m.Handler, nil
}

// pendingSource is a source whose one entry is pending to consumer c of group g, in
// the stream ns+"s".
func pendingSource(t *testing.T, rdb *redis.Client, ns string) *streamSource {
	t.Helper()
	stream := ns + "s"
	id := pendingEntry(t, rdb, stream, "c")
	return &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
}

func pendingEntry(t *testing.T, rdb *redis.Client, stream, consumer string) string {
	t.Helper()
	ctx := context.Background()
	id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": "{}"}}).Val()
	rdb.XGroupCreateMkStream(ctx, stream, "g", "0")
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: consumer, Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

// A redelivered copy of the entry a live holder is working on is neither run nor acked.
func TestInFlightCopyOfLiveHoldersEntryIsNeitherRunNorAcked(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	stream := ns + "s"
	id := pendingEntry(t, rdb, stream, "holder")
	holder, err := l.Acquire(context.Background(), "triage", "RHEL-1", lease.AcquireOptions{Owner: "holder", MessageID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "other", ID: id, ReadAt: time.Now()}}
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage", Source: src, OnConflict: recordTo(ns + "results"), MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	msg := message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if ran {
		t.Fatal("the live holder's entry ran a second time")
	}
	if p := rdb.XPending(context.Background(), stream, "g").Val(); p.Count != 1 {
		t.Fatalf("the live holder's entry was acked: pending %d", p.Count)
	}
	if n := rdb.XLen(context.Background(), ns+"results").Val(); n != 0 {
		t.Fatal("recorded as dropped")
	}
	if src.settled != 1 {
		t.Fatal("subscriber not told to skip its ack")
	}
}

// A different event for a held issue is acked and dropped, with a record naming the holder.
func TestOtherEventForHeldIssueIsAckedAndDropped(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	stream := ns + "s"
	id := pendingEntry(t, rdb, stream, "other")
	holder, err := l.Acquire(context.Background(), "triage", "RHEL-1", lease.AcquireOptions{Owner: "holder", MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "other", ID: id, ReadAt: time.Now()}}
	mw, _ := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage", Source: src, OnConflict: recordTo(ns + "results"), MaxIdleTime: time.Hour})
	h := mw(func(*message.Message) ([]*message.Message, error) { t.Fatal("ran"); return nil, nil })
	if _, err := h(message.NewMessage("u2", []byte(`{"metadata":{"issue":"rhel-1"}}`))); err != nil {
		t.Fatal(err)
	}
	if p := rdb.XPending(context.Background(), stream, "g").Val(); p.Count != 0 {
		t.Fatal("dropped event not acked")
	}
	rec := rdb.XRange(context.Background(), ns+"results", "-", "+").Val()
	if len(rec) != 1 || rec[0].Values["queued"] != "0" || rec[0].Values["superseded"] != "0" || rec[0].Values["holder"] != "holder" ||
		rec[0].Values["holder_fence"] != "1" || rec[0].Values["message_id"] != id || rec[0].Values["issue_key"] != "RHEL-1" {
		t.Fatalf("record = %v", rec)
	}
}

// Release happens before the error goes back for a retry, so the retry is not "locked".
func TestHandlerErrorReleasesBeforeReturning(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	mw, _ := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage"})
	boom := errors.New("boom")
	h := mw(func(*message.Message) ([]*message.Message, error) { return nil, boom })
	msg := message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-2"}}`))
	if _, err := h(msg); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if exists(t, rdb, "lock:"+ns+"triage:RHEL-2") {
		t.Fatal("lease held after the handler failed")
	}
	if _, err := h(msg); !errors.Is(err, boom) {
		t.Fatalf("retry was not run: %v", err)
	}
}

func TestMiddlewareRejectsMaxIdleBelowHeartbeat(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l, err := lease.New(rdb, lease.Options{Scope: ns, TTL: 300 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage", Source: &streamSource{}, MaxIdleTime: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "Config.MaxIdleTime") {
		t.Fatalf("err = %v, want a Config.MaxIdleTime error", err)
	}
}

func TestBadKeyTakesNoLock(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	mw, _ := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage"})
	h := mw(func(*message.Message) ([]*message.Message, error) { t.Fatal("ran"); return nil, nil })
	for _, p := range []string{`not json`, `{"metadata":{}}`, `{"metadata":{"issue":"../x"}}`} {
		_, err := h(message.NewMessage("u", []byte(p)))
		if !errors.Is(err, lease.ErrInvalidKey) && !errors.Is(err, lockmw.ErrNoIssueKey) {
			t.Fatalf("%s: err = %v", p, err)
		}
	}
	if keys := rdb.Keys(context.Background(), "*"+ns+"*").Val(); len(keys) != 0 {
		t.Fatalf("bad keys created %v", keys)
	}
}

// peekSource announces the entry it hands over next.
type peekSource struct {
	streamSource
	nextID, nextKey string
}

func (p *peekSource) Peek() (string, string, bool) { return p.nextID, p.nextKey, p.nextID != "" }

// The next entry's lease is taken in the release's round trip; if that entry never
// comes (shutdown), Close gives the lease back; if another entry comes instead, the
// lease taken ahead is given back before anything else.
// handoffEnv runs one event (RHEL-1, entry a) through a middleware whose source
// announces entry b (RHEL-2) as the next one, so b's lease is taken ahead.
type handoffEnv struct {
	rdb    *redis.Client
	ns     string
	l      *lease.Locker
	stream string
	a, b   string
	src    *peekSource
	mw     *lockmw.Middleware
	h      message.HandlerFunc
}

func newHandoffEnv(t *testing.T) *handoffEnv {
	t.Helper()
	rdb, ns := redistest.Client(t)
	e := &handoffEnv{rdb: rdb, ns: ns, l: locker(t, rdb, ns), stream: ns + "s"}
	e.a = pendingEntry(t, rdb, e.stream, "c")
	e.b = rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.stream, Values: map[string]any{"payload": "{}"}}).Val()
	e.src = &peekSource{streamSource: streamSource{entry: lockmw.Entry{Stream: e.stream, Group: "g", Consumer: "c", ID: e.a, ReadAt: time.Now()}},
		nextID: e.b, nextKey: "RHEL-2"}
	mw, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: e.l, Agent: "triage", Source: e.src, MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e.mw = mw
	e.h = mw.Handler(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	if _, err := e.h(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestHandoffLeaseIsGivenBack(t *testing.T) {
	t.Parallel()
	e := newHandoffEnv(t)
	rdb, ns, l, stream, a, b, src, mw, h := e.rdb, e.ns, e.l, e.stream, e.a, e.b, e.src, e.mw, e.h
	info, held, err := l.Inspect(context.Background(), "triage", "RHEL-2")
	if err != nil || !held || info.MessageID != b {
		t.Fatalf("next entry's lease not taken ahead: held=%v info=%+v err=%v", held, info, err)
	}
	if exists(t, rdb, "lock:"+ns+"triage:RHEL-1") {
		t.Fatal("current lease not released")
	}
	mw.Close(context.Background())
	if exists(t, rdb, "lock:"+ns+"triage:RHEL-2") {
		t.Fatal("Close left the lease taken ahead")
	}

	// Announced b, delivered c: b's lease goes back, c runs under its own.
	c := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": "{}"}}).Val()
	src.entry.ID = a
	if _, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
		t.Fatal(err)
	}
	src.entry.ID, src.nextID = c, ""
	var ran bool
	h2 := mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		ran = true
		if exists(t, rdb, "lock:"+ns+"triage:RHEL-2") {
			t.Error("lease taken ahead for b still held while c runs")
		}
		return nil, nil
	})
	if _, err := h2(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-3"}}`))); err != nil || !ran {
		t.Fatalf("c: ran=%v err=%v", ran, err)
	}
}

// A lease taken ahead for an entry that never reaches the middleware (dead-lettered
// before it, say) is given back by itself.
func TestHandoffLeaseExpiresWhenEntryNeverComes(t *testing.T) {
	t.Parallel()
	e := newHandoffEnv(t)
	rdb, ns := e.rdb, e.ns
	if !exists(t, rdb, "lock:"+ns+"triage:RHEL-2") {
		t.Fatal("no lease taken ahead")
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return !exists(t, rdb, "lock:"+ns+"triage:RHEL-2") },
		"the lease taken ahead to be given back")
}

// Without an IssueKey extractor the middleware reads metadata issue_key and nothing
// else, and writes the canonical key and the fence back for the handler.
func TestDefaultIssueKeyIsMetadataOnly(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "triage"})
	if err != nil {
		t.Fatal(err)
	}
	var held string
	h := mw.Handler(func(m *message.Message) ([]*message.Message, error) {
		le, _ := lockmw.LeaseFrom(m.Context())
		held = le.Issue()
		return nil, nil
	})
	msg := message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-9"}}`))
	if _, err := h(msg); !errors.Is(err, lockmw.ErrNoIssueKey) || held != "" {
		t.Fatalf("payload-only key: err = %v, ran under %q", err, held)
	}
	msg.Metadata.Set(event.MetaIssueKey, " rhel-8 ")
	if _, err := h(msg); err != nil || held != "RHEL-8" {
		t.Fatalf("metadata key: err = %v, ran under %q", err, held)
	}
	if msg.Metadata.Get(event.MetaIssueKey) != "RHEL-8" || msg.Metadata.Get(event.MetaFence) != "1" {
		t.Fatalf("metadata after the run: %v", msg.Metadata)
	}
}

// The end of an event (release, ack and the next entry's acquire, one script sent by
// EVALSHA) works on a server that lost its scripts (a restart, SCRIPT FLUSH): sent
// again in full, it runs once and in order.
func TestHandoffAfterScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{}) // SCRIPT FLUSH is server-wide
	rdb := srv.Client()
	ctx := context.Background()
	l := locker(t, rdb, "")
	a := pendingEntry(t, rdb, "s", "c")
	b := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: map[string]any{"payload": "{}"}}).Val()
	src := &peekSource{streamSource: streamSource{entry: lockmw.Entry{Stream: "s", Group: "g", Consumer: "c", ID: a, ReadAt: time.Now()}},
		nextID: b, nextKey: "RHEL-2"}
	mw, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage", Source: src, MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(func(*message.Message) ([]*message.Message, error) { return nil, nil })

	rdb.ScriptFlush(ctx)
	if _, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
		t.Fatal(err)
	}
	if exists(t, rdb, "lock:triage:RHEL-1") || rdb.XPending(ctx, "s", "g").Val().Count != 0 {
		t.Fatal("first event not released and acked")
	}
	if info, held, err := l.Inspect(ctx, "triage", "RHEL-2"); err != nil || !held || info.MessageID != b {
		t.Fatalf("next entry's lease not taken ahead: held=%v info=%+v err=%v", held, info, err)
	}

	rdb.ScriptFlush(ctx)
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{"s", ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	src.entry.ID, src.nextID = b, ""
	if _, err := h(message.NewMessage("u2", []byte(`{"metadata":{"issue":"RHEL-2"}}`))); err != nil {
		t.Fatal(err)
	}
	if exists(t, rdb, "lock:triage:RHEL-2") || rdb.XPending(ctx, "s", "g").Val().Count != 0 || src.settled != 2 {
		t.Fatalf("second event not released and acked (settled %d)", src.settled)
	}
}

// A lease taken ahead and given back (Close, or another entry delivered instead) is not
// a run: an event of that issue that entered its stream before the give-back still
// runs, rather than being dropped as superseded.
func TestGivenBackLeaseSupersedesNothing(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"close", "other entry"} {
		t.Run(path, func(t *testing.T) {
			e := newHandoffEnv(t)
			// d, of b's issue, entered before the lease taken ahead for b goes back.
			d := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.stream, Values: map[string]any{"payload": "{}"}}).Val()
			// The superseded check has millisecond resolution: give back in a later one.
			redistest.Eventually(t, 5*time.Second, func() bool {
				return e.rdb.Time(context.Background()).Val().UnixMilli() > streamMS(d)
			}, "Redis clock past %s", d)
			switch path {
			case "close":
				e.mw.Close(context.Background())
			default:
				e.src.entry.ID, e.src.nextID = d, ""
			}
			var ran bool
			h := e.mw.Handler(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
			if _, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-2"}}`))); err != nil {
				t.Fatal(err)
			}
			if !ran {
				t.Fatal("d, of the issue whose lease was only taken ahead and given back, was dropped")
			}
		})
	}
}

func streamMS(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}

// A shutdown that cancels the handler's context just after its last write does not
// undo the run: the lease was still held, so the entry is released and acked, not
// left for a redelivery that would record a second outcome. A handler that finished
// after its lease was taken over is still left pending.
func TestHandlerFinishedAsItsLeaseEndedIsAckedOnlyIfStillHeld(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		takenOver bool
	}{{"shutdown", false}, {"taken over", true}} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, ns := redistest.Client(t)
			ctx := context.Background()
			l := locker(t, rdb, ns)
			stream := ns + "s"
			id := pendingEntry(t, rdb, stream, "c")
			src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
			mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage", Source: src, MaxIdleTime: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			lock := "lock:" + ns + "triage:RHEL-7"
			runCtx, shutdown := context.WithCancel(ctx)
			defer shutdown()
			h := mw(func(msg *message.Message) ([]*message.Message, error) {
				if tc.takenOver {
					rdb.Set(ctx, lock, "someone-else", time.Minute)
				}
				shutdown() // the worker's SIGTERM, after the handler's last write
				<-msg.Context().Done()
				return nil, nil
			})
			msg := message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-7"}}`))
			msg.SetContext(runCtx)
			_, err = h(msg)
			pending := rdb.XPending(ctx, stream, "g").Val().Count
			if tc.takenOver {
				if err == nil || pending != 1 {
					t.Fatalf("taken over: err = %v, pending = %d; want an error and the entry left pending", err, pending)
				}
				if got := rdb.Get(ctx, lock).Val(); got != "someone-else" {
					t.Fatalf("the new holder's lock was touched: %q", got)
				}
				return
			}
			if err != nil || pending != 0 || src.settled != 1 {
				t.Fatalf("shutdown: err = %v, pending = %d, settled = %d; want the finished entry acked", err, pending, src.settled)
			}
			if exists(t, rdb, lock) {
				t.Fatal("lease still held")
			}
		})
	}
}

// With Config.EventTypes, NewMiddleware refuses a Policies table naming another type.
func TestNewMiddlewareRefusesUnknownEventType(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	pol, err := lockmw.ParsePolicies("bogus.event=drop,*=coalesce")
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "triage", Policies: pol, EventTypes: []string{"triage.requested"}})
	if err == nil || !strings.Contains(err.Error(), "Config.Policies") || !strings.Contains(err.Error(), "bogus.event is not an event type") {
		t.Fatalf("NewMiddleware = %v, want an error naming Config.Policies and bogus.event", err)
	}
	if _, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "triage", Policies: pol}); err != nil {
		t.Fatalf("without EventTypes any type goes: %v", err)
	}
}
