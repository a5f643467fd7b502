package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Same-issue events published concurrently while one runs: exactly one run per burst,
// a lock.dropped record for each of the others, with three routers competing.
func TestBurstOfSameIssueRunsOnceUnderDrop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const routers, bursts, perBurst = 3, 5, 10
	var r runs
	var published atomic.Int64
	handler := func(msg *message.Message) error {
		r.Add(issueOf(msg))
		// Hold the lease until the whole burst is in the stream, so every other event of
		// the burst arrives while this run is going on.
		want := published.Load()
		redistest.Eventually(t, 5*time.Second, func() bool {
			return e.rdb.XLen(context.Background(), e.triage()).Val() >= want
		}, "burst published")
		time.Sleep(50 * time.Millisecond)
		return nil
	}
	for i := range routers {
		e.start(ctx, routerOpts{Consumer: fmt.Sprintf("w%d", i)}, handler)
	}
	for b := 1; b <= bursts; b++ {
		published.Add(perBurst)
		var wg sync.WaitGroup
		for range perBurst {
			wg.Add(1)
			go func() { defer wg.Done(); e.publishTriage("RHEL-7") }()
		}
		wg.Wait()
		redistest.Eventually(t, 30*time.Second, func() bool {
			return len(e.results("lock.dropped")) == b*(perBurst-1) && e.pending(e.triage()) == 0
		}, "burst %d settled: %d dropped before it", b, len(e.results("lock.dropped")))
		if got := r.Get("RHEL-7"); got != b {
			t.Fatalf("after burst %d: %d runs, want %d", b, got, b)
		}
	}
	for _, d := range e.results("lock.dropped") {
		if d.Values["issue_key"] != "RHEL-7" || d.Values["agent"] != "triage" || d.Values["message_id"] == "" ||
			d.Values["holder_message_id"] == "" {
			t.Fatalf("incomplete lock.dropped record: %v", d.Values)
		}
		if d.Values["reason"] == "locked" && d.Values["holder"] == "" {
			t.Fatalf("locked drop does not name the holder: %v", d.Values)
		}
	}
}

// A handler that runs for 3× MAX_IDLE_TIME while another consumer polls and claims:
// one run, and the other consumer never takes (nor acks) the entry.
func TestLongHandlerEntryIsNeverStolen(t *testing.T) {
	// Not parallel: heartbeats against the claim idle time: a starved heartbeat on a busy machine would let the claim win.
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	maxIdle := 400 * time.Millisecond // > heartbeat 600ms/3
	var r runs
	var otherRan atomic.Bool
	done := make(chan struct{})
	e.start(ctx, routerOpts{Consumer: "a", TTL: 600 * time.Millisecond, MaxIdle: maxIdle}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		time.Sleep(3 * maxIdle) // the point: a run longer than MAX_IDLE_TIME
		close(done)
		return nil
	})
	id := e.publishTriage("RHEL-2")
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-2") == 1 }, "run started")
	e.start(ctx, routerOpts{Consumer: "b", TTL: 600 * time.Millisecond, MaxIdle: maxIdle}, func(msg *message.Message) error {
		otherRan.Store(true)
		return nil
	})
	for {
		select {
		case <-done:
			redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "entry acked")
			if otherRan.Load() || r.Get("RHEL-2") != 1 {
				t.Fatalf("runs=%d, other consumer ran=%v", r.Get("RHEL-2"), otherRan.Load())
			}
			if n := len(e.results("lock.dropped")); n != 0 {
				t.Fatalf("the in-flight entry was dropped (acked) by the other consumer: %d records", n)
			}
			return
		default:
		}
		p, err := e.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.triage(), Group: "triage", Start: id, End: id, Count: 1}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 1 && p[0].Consumer != "a-0" {
			t.Fatalf("in-flight entry moved to %s", p[0].Consumer)
		}
		if len(p) == 1 && p[0].Idle > maxIdle {
			t.Fatalf("in-flight entry idle %s > MAX_IDLE_TIME: claimable", p[0].Idle)
		}
		time.Sleep(20 * time.Millisecond) // sampling: the invariant is checked all along the run
	}
}

// Entries that wait in a busy consumer's read-ahead buffer age and are claimed by an
// idle consumer; the busy one must then not run them a second time (read-ahead, in
// docs/architecture.md, "The read path").
func TestReadAheadEntryClaimedAwayRunsOnce(t *testing.T) {
	// Not parallel: it waits out claim idle times (timing against MaxIdleTime).
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	maxIdle := 400 * time.Millisecond
	var r runs
	started := make(chan struct{}, 1)
	e.start(ctx, routerOpts{Consumer: "a", TTL: 600 * time.Millisecond, MaxIdle: maxIdle}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		if issueOf(msg) == "RHEL-1" {
			started <- struct{}{}
			time.Sleep(4 * maxIdle) // the point: RHEL-2 and RHEL-3 age past MAX_IDLE_TIME in a's read-ahead
		}
		return nil
	})
	e.publishTriage("RHEL-1")
	<-started
	e.publishTriage("RHEL-2") // read ahead by a, stuck behind RHEL-1
	e.publishTriage("RHEL-3")
	e.start(ctx, routerOpts{Consumer: "b", TTL: 600 * time.Millisecond, MaxIdle: maxIdle}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		return nil
	})
	redistest.Eventually(t, 10*time.Second, func() bool {
		return r.Get("RHEL-1") == 1 && r.Get("RHEL-2") >= 1 && r.Get("RHEL-3") >= 1 && e.pending(e.triage()) == 0
	}, "all three run")
	time.Sleep(2 * maxIdle) // a's buffer drains after RHEL-1; nothing may run again
	for _, k := range []string{"RHEL-1", "RHEL-2", "RHEL-3"} {
		if n := r.Get(k); n != 1 {
			t.Fatalf("%s ran %d times", k, n)
		}
	}
}

// Lease loss (the key deleted behind the holder's back): the handler's context is
// cancelled with ErrLeaseLost, the entry stays pending, and the event runs again.
func TestLeaseLossCancelsHandlerAndEventReruns(t *testing.T) {
	// Not parallel: it times the lease's TTL and the cancellation that follows its loss.
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	var firstCause atomic.Value
	e.start(ctx, routerOpts{TTL: 600 * time.Millisecond}, func(msg *message.Message) error {
		if r.Add(issueOf(msg)) > 1 {
			return nil
		}
		le, _ := lockmw.LeaseFrom(msg.Context())
		e.rdb.Del(context.Background(), le.Keys().Lock)
		select {
		case <-msg.Context().Done():
			firstCause.Store(context.Cause(msg.Context()))
			return msg.Context().Err()
		case <-time.After(5 * time.Second):
			return errors.New("context not cancelled after the lease was lost")
		}
	})
	e.publishTriage("RHEL-4")
	redistest.Eventually(t, 10*time.Second, func() bool { return r.Get("RHEL-4") == 2 && e.pending(e.triage()) == 0 }, "re-run after loss")
	if c, _ := firstCause.Load().(error); !errors.Is(c, lease.ErrLeaseLost) {
		t.Fatalf("first run's cause = %v, want ErrLeaseLost", c)
	}
	if n := len(e.dead()); n != 0 {
		t.Fatalf("lease loss dead-lettered the event (%d)", n)
	}
}

// Coalesce: 50 events for one issue during one long run → exactly two runs: the first,
// and one follow-up with the newest event.
func TestCoalesceRunsTwice(t *testing.T) {
	// Not parallel: the coalesced event runs after the release, within a bound timed against the lease.
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	var published atomic.Int64
	var lastPayloads sync.Map
	handler := func(msg *message.Message) error {
		n := r.Add(issueOf(msg))
		lastPayloads.Store(n, msg.UUID)
		if n == 1 {
			redistest.Eventually(t, 10*time.Second, func() bool {
				return int64(len(e.results("lock.coalesced"))) >= published.Load()-3
			}, "the other events coalesced")
		}
		return nil
	}
	for i := range 2 {
		e.start(ctx, routerOpts{Consumer: fmt.Sprintf("w%d", i), Policy: lockmw.Coalesce}, handler)
	}
	published.Store(51)
	e.publishTriage("RHEL-5")
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-5") == 1 }, "first run")
	for range 50 {
		e.publishTriage("RHEL-5")
	}
	deadline := time.Now().Add(15 * time.Second)
	for r.Get("RHEL-5") != 2 || e.pending(e.triage()) != 0 {
		if time.Now().After(deadline) {
			keys := e.rdb.Keys(ctx, "*"+e.ns+"*").Val()
			t.Fatalf("no follow-up run: runs=%d pending=%d len=%d coalesced=%d dropped=%d keys=%v done=%q",
				r.Get("RHEL-5"), e.pending(e.triage()), e.rdb.XLen(ctx, e.triage()).Val(),
				len(e.results("lock.coalesced")), len(e.results("lock.dropped")), keys,
				e.rdb.Get(ctx, "lockdone:"+e.ns+"triage:RHEL-5").Val())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("coalesced=%d dropped=%d", len(e.results("lock.coalesced")), len(e.results("lock.dropped")))
	time.Sleep(time.Second) // a window for a wrong third run to show: an absence takes time to see
	if n := r.Get("RHEL-5"); n != 2 {
		t.Fatalf("%d runs, want exactly 2", n)
	}
	// Every entry about the issue is in its index: the 51 requests and the follow-up the
	// release published (in the release's script), and each drop or coalesce record.
	for s, least := range map[string]int64{e.triage(): 52, e.Topology.Results(): 49} {
		if n, idx := e.rdb.XLen(ctx, s).Val(), e.rdb.ZCard(ctx, xonce.IndexKey(s, "RHEL-5")).Val(); n != idx || n < least {
			t.Errorf("%s: %d entries, %d in the issue's index", s, n, idx)
		}
	}
}

// Bad events (docs/architecture.md, "Bad input"), rows 1–4: to the dead-letter stream with the reason, acked, no lock taken,
// and the router keeps running.
func TestBadInputGoesToDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	e.start(ctx, routerOpts{}, func(msg *message.Message) error { r.Add(issueOf(msg)); return nil })
	add := func(values map[string]any) {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ok := map[string]any{"_watermill_message_uuid": "u", "m:schema_version": "1", "m:event_type": "triage.requested"}
	with := func(kv ...any) map[string]any {
		v := map[string]any{}
		for k, x := range ok {
			v[k] = x
		}
		for i := 0; i < len(kv); i += 2 {
			v[kv[i].(string)] = kv[i+1]
		}
		return v
	}
	cases := []struct {
		name   string
		values map[string]any
		reason string
	}{
		{"not JSON", with("payload", "{not json"), "not a JSON object"},
		{"no issue key", with("payload", `{"metadata":{}}`), "no issue key"},
		{"empty key", with("payload", `{"metadata":{"issue":""}}`), "no issue key"},
		{"path", with("payload", `{"metadata":{"issue":"../x"}}`), "invalid issue key"},
		{"space inside", with("payload", `{"metadata":{"issue":"RHEL 12"}}`), "invalid issue key"},
		{"300 chars", with("payload", `{"metadata":{"issue":"`+strings.Repeat("A", 296)+`-1"}}`), "invalid issue key"},
		{"control char", with("payload", "{\"metadata\":{\"issue\":\"RHEL-1\\u0007\"}}"), "invalid issue key"},
		{"schema", with("payload", `{"metadata":{"issue":"RHEL-1"}}`, "m:schema_version", "9"), "unknown schema_version"},
		{"event type", with("payload", `{"metadata":{"issue":"RHEL-1"}}`, "m:event_type", "rebase.requested"), "not for agent triage"},
		{"no uuid field", map[string]any{"payload": `{"metadata":{"issue":"RHEL-1"}}`}, "undecodable entry"},
	}
	for _, c := range cases {
		add(c.values)
	}
	e.publishTriage("RHEL-99") // the router must still be running after all that
	redistest.Eventually(t, 10*time.Second, func() bool {
		return r.Get("RHEL-99") == 1 && len(e.dead()) == len(cases) && e.pending(e.triage()) == 0
	}, "bad events dead-lettered (%d of %d), good one run", len(e.dead()), len(cases))
	dead := e.dead()
	for i, c := range cases {
		d := dead[i].Values
		if !strings.Contains(fmt.Sprint(d[event.DeadFieldError]), c.reason) || d[event.DeadFieldStream] != e.triage() || d[event.DeadFieldID] == "" {
			t.Errorf("%s: dead entry %v, want reason %q", c.name, d, c.reason)
		}
		if d["payload"] != c.values["payload"] {
			t.Errorf("%s: original payload not kept: %v", c.name, d["payload"])
		}
	}
	if keys := e.rdb.Keys(ctx, "lock*"+e.ns+"*").Val(); len(keys) > 0 {
		for _, k := range keys {
			if !strings.Contains(k, "RHEL-99") {
				t.Fatalf("a bad event took a lock: %v", keys)
			}
		}
	}
	if r.Get("RHEL-1") != 0 {
		t.Fatal("a bad event reached the handler")
	}
}

// Bad input never names a Redis key (issue 35): an event whose issue key is one of the
// invalid keys of docs/architecture.md, "Bad input" (../x, spaces inside, 300
// characters, control characters), in its payload or its metadata, is dead-lettered
// and filed in the dead-letter stream's index under event.InvalidIssue; no key of the
// namespace contains the bad value.
func TestBadKeysNameNoRedisKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.start(ctx, routerOpts{}, func(*message.Message) error { return nil })
	bad := []string{"../etc/passwd", "RHEL 12", strings.Repeat("A", 296) + "-1", "RHEL-1\u0007", "rhel-1\n../x", "RHEL-1/../../x"}
	for _, k := range bad {
		base := map[string]any{"_watermill_message_uuid": "u", "m:schema_version": "1", "m:event_type": "triage.requested"}
		inPayload := maps.Clone(base)
		payload, _ := json.Marshal(map[string]any{"metadata": map[string]string{"issue": k}})
		inPayload["payload"] = string(payload)
		inMeta := maps.Clone(base)
		inMeta["payload"], inMeta["m:issue_key"] = `{}`, k
		for _, v := range []map[string]any{inPayload, inMeta} {
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: v}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 2*len(bad) && e.pending(e.triage()) == 0 },
		"bad events dead-lettered (%d of %d)", len(e.dead()), 2*len(bad))
	if n := e.rdb.ZCard(ctx, xonce.IndexKey(e.Topology.Dead(), event.InvalidIssue)).Val(); n != int64(2*len(bad)) {
		t.Errorf("%d dead letters in the index of invalid keys, want %d", n, 2*len(bad))
	}
	keys := e.rdb.Keys(ctx, "*"+e.ns+"*").Val()
	for _, k := range keys {
		for _, raw := range bad {
			if strings.Contains(k, raw) || strings.Contains(k, strings.ToUpper(raw)) {
				t.Errorf("key %q contains the bad key %q", k, raw)
			}
		}
		if strings.ContainsAny(k, "/ \a\n") {
			t.Errorf("key %q contains a character of a bad key", k)
		}
	}
}

// A handler that keeps failing is retried MAX_RETRIES times inside one lease, then
// dead-lettered with its error and attempt count; the lease is released.
func TestExhaustedRetriesGoToDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var attempts atomic.Int64
	var fences sync.Map
	e.start(ctx, routerOpts{MaxRetries: 3}, func(msg *message.Message) error {
		attempts.Add(1)
		fences.Store(msg.Metadata.Get("fence"), true)
		return errBoom
	})
	e.publishTriage("RHEL-6")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 1 && e.pending(e.triage()) == 0 }, "dead-lettered")
	d := e.dead()[0].Values
	if attempts.Load() != 3 || d[event.DeadFieldAttempts] != "3" || !strings.Contains(fmt.Sprint(d[event.DeadFieldError]), "boom") {
		t.Fatalf("attempts=%d dead=%v", attempts.Load(), d)
	}
	n := 0
	fences.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("retries ran under %d fences, want one lease", n)
	}
	if e.rdb.Exists(ctx, "lock:"+e.ns+"triage:RHEL-6").Val() != 0 {
		t.Fatal("lease not released after the last attempt")
	}
	// The dead letter is in the issue's index of the dead-letter stream.
	if idx := e.rdb.ZRange(ctx, xonce.IndexKey(e.Topology.Dead(), "RHEL-6"), 0, -1).Val(); len(idx) != 1 || xonce.IndexID(idx[0]) != e.dead()[0].ID {
		t.Fatalf("dead-letter index = %v, want [%s]", idx, e.dead()[0].ID)
	}
}

// A dead letter of an error longer than its bound keeps the error's start and its end,
// where an agent's stderr says why it failed (issue 35).
func TestDeadLetterKeepsTheEndOfALongError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := "exec runner: exit status 1; stderr: " + strings.Repeat("INFO cloning and building ünïcode\n", 1000) + "FATAL: patch 0003 does not apply"
	e.start(ctx, routerOpts{MaxRetries: 1}, func(*message.Message) error { return errors.New(long) })
	e.publishTriage("RHEL-6")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 1 }, "dead-lettered")
	got := fmt.Sprint(e.dead()[0].Values[event.DeadFieldError])
	if !strings.HasPrefix(got, "exec runner: exit status 1; stderr: INFO") || !strings.HasSuffix(got, "FATAL: patch 0003 does not apply") ||
		len(got) > 9<<10 || !utf8.ValidString(got) || !strings.Contains(got, "…") {
		t.Fatalf("dead letter error (%d bytes): %.200q … %q", len(got), got, got[max(0, len(got)-80):])
	}
}

// A dead letter's error holds no credential shapes that nobody configured (a token in a
// handler's error), as a Jira comment's text holds none (issue 35).
func TestDeadLetterMasksCredentialShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	token := "glpat-" + strings.Repeat("x9Y8", 6)
	e.start(ctx, routerOpts{MaxRetries: 1}, func(*message.Message) error {
		return errors.New("push refused: Authorization: Bearer abcdefgh12345678 api_key=" + token)
	})
	e.publishTriage("RHEL-6")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 1 }, "dead-lettered")
	got := fmt.Sprint(e.dead()[0].Values[event.DeadFieldError])
	if strings.Contains(got, "abcdefgh12345678") || strings.Contains(got, token) || !strings.Contains(got, "push refused") {
		t.Fatalf("dead letter error %q", got)
	}
}

// Entries written by a stock watermill-redisstream publisher (msgpack metadata) are read;
// ours are readable with redis-cli: one field per metadata key.
func TestEntriesAreReadableAndLegacyFormatIsRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	e.start(ctx, routerOpts{}, func(msg *message.Message) error { r.Add(issueOf(msg)); return nil })
	id := e.publishTriage("RHEL-31")
	vals := e.rdb.XRange(ctx, e.triage(), id, id).Val()[0].Values
	if vals["m:issue_key"] != "RHEL-31" || vals["m:event_type"] != "triage.requested" || vals["payload"] == "" {
		t.Fatalf("entry not readable field by field: %v", vals)
	}
	stock, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: e.rdb}, nil)
	if err != nil {
		t.Fatal(err)
	}
	legacy := message.NewMessage("legacy-1", []byte(`{"metadata":{"issue":"rhel-32"}}`))
	legacy.Metadata.Set("event_type", "triage.requested")
	if err := stock.Publish(e.triage(), legacy); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-31") == 1 && r.Get("RHEL-32") == 1 }, "both formats handled")
}

// Closing a router closes its subscribers' own clients, never the shared one.
func TestCloseLeavesSharedClientOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	r, done := e.start(ctx, routerOpts{}, func(*message.Message) error { return nil })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("router: %v", err)
	}
	_ = r
	if err := e.rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("shared client closed with the router: %v", err)
	}
}

// Retries back off exponentially from RetryInitial (here 100ms, then 200ms), not faster
// and not slower.
func TestRetryBackoffSchedule(t *testing.T) {
	// Not parallel: it measures the retry backoff's intervals.
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var at []time.Time
	cfg := pipeline.RouterConfig{Client: e.rdb, ClientOptions: e.opts, Topology: e.topo, Agent: "triage",
		Consumer: "w", BlockTime: 200 * time.Millisecond, MaxIdleTime: 2 * time.Second, MaxRetries: 3,
		RetryInitial: 100 * time.Millisecond, Locker: e.locker(3 * time.Second),
		Handler: func(*message.Message) error {
			mu.Lock()
			at = append(at, time.Now())
			mu.Unlock()
			return errBoom
		}}
	e.Start(ctx, cfg)
	e.publishTriage("RHEL-8")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 1 }, "dead-lettered")
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 3 {
		t.Fatalf("%d attempts, want 3", len(at))
	}
	for i, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond} {
		if gap := at[i+1].Sub(at[i]); gap < want || gap > 2*want {
			t.Fatalf("wait before attempt %d = %s, want about %s", i+2, gap, want)
		}
	}
}

// CONCURRENCY n means n subscriptions per input stream, named <consumer>-0..n-1, each
// with one event in flight; conflicts are counted in the metrics.
func TestConcurrencyIsSubscriptionsAndConflictsAreCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metrics := pipeline.NewMetrics(nil)
	var inFlight, peak atomic.Int64
	both := make(chan struct{})
	var once sync.Once
	locker, err := lease.New(e.rdb, lease.Options{Scope: e.ns, TTL: 3 * time.Second, Observer: metrics})
	if err != nil {
		t.Fatal(err)
	}
	cfg := pipeline.RouterConfig{Client: e.rdb, ClientOptions: e.opts, Topology: e.topo, Agent: "triage",
		Consumer: "w", Concurrency: 2, BlockTime: 200 * time.Millisecond, MaxIdleTime: 2 * time.Second,
		Locker: locker, Metrics: metrics,
		Handler: func(msg *message.Message) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			if n == 2 {
				once.Do(func() { close(both) })
			}
			select {
			case <-both:
			case <-time.After(5 * time.Second):
			}
			return nil
		}}
	e.Start(ctx, cfg)
	// One subscription may read up to three entries ahead of the other (one in flight, two
	// read ahead); with six, the other one gets some.
	for i := range 6 {
		e.publishTriage("RHEL-" + strconv.Itoa(61+i*10))
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return e.pending(e.triage()) == 0 && peak.Load() == 2 }, "two in flight at once")
	consumers := map[string]bool{}
	for _, c := range e.rdb.XInfoConsumers(ctx, e.triage(), "triage").Val() {
		consumers[c.Name] = true
	}
	if !consumers["w-0"] || !consumers["w-1"] || len(consumers) != 2 {
		t.Fatalf("consumers %v, want w-0 and w-1", consumers)
	}
	// A conflict, counted: hold RHEL-63 by hand, then publish an event for it.
	held, err := locker.Acquire(ctx, "triage", "RHEL-63", lease.AcquireOptions{Owner: "someone"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	e.publishTriage("RHEL-63")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.results("lock.dropped")) == 1 }, "dropped")
	// The counter goes up once the drop's record is written: wait for it, then hold it to one.
	conflicts := func() float64 { // the sum of the family's series, as /metrics shows them
		var buf bytes.Buffer
		metrics.Registry.WritePrometheus(&buf)
		var n float64
		for _, line := range strings.Split(buf.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "ymirflow_lock_conflicts_total{"); ok {
				v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
				if err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				n += v
			}
		}
		return n
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return conflicts() >= 1 }, "the conflict counted")
	got := conflicts()
	if got != 1 {
		t.Fatalf("lock_conflicts_total = %v, want 1", got)
	}
	// Each handler run is timed, by handler and outcome (Watermill's metric, kept by name).
	var buf bytes.Buffer
	metrics.Registry.WritePrometheus(&buf)
	for _, want := range []string{"# TYPE ymirflow_handler_execution_time_seconds histogram\n",
		`ymirflow_handler_execution_time_seconds_count{handler_name="` + e.triage() + `#0",success="true"} `,
		`ymirflow_handler_execution_time_seconds_bucket{handler_name="` + e.triage() + `#1",success="true",le="+Inf"} `} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, buf.String())
		}
	}
}
