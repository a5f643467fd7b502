package inspect_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

func (e *env) inspector(locker *lease.Locker, page int64) *inspect.Inspector {
	e.t.Helper()
	if locker == nil {
		locker = e.TriageLocker(time.Minute)
	}
	in, err := inspect.New(inspect.Config{Client: e.Client, Topology: e.Topology, Locker: locker, PageSize: page})
	if err != nil {
		e.t.Fatal(err)
	}
	return in
}

// publishTo appends a request for key to stream (no lease) and returns its id.
func (e *env) publishTo(stream, eventType, key string) string {
	e.t.Helper()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `","jira_issue":"` + key + `"}}`))
	msg, err := event.New(eventType, key, task, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	id, err := e.Publisher.PublishID(context.Background(), stream, msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// readAs delivers up to n entries of stream to consumer of group, leaving them pending.
func (e *env) readAs(stream, group, consumer string, n int64) []redis.XMessage {
	e.t.Helper()
	ctx := context.Background()
	if err := e.Client.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		e.t.Fatal(err)
	}
	res, err := e.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer, Streams: []string{stream, ">"}, Count: n}).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return res[0].Messages
}

func TestPendingShowsGuardedAndOrphanedEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	locker := e.TriageLocker(time.Minute)
	in := e.inspector(locker, 2) // pages of 2: the 4 entries take 2 pages
	ids := []string{e.PublishTriage("RHEL-1"), e.PublishTriage("RHEL-2"), e.PublishTriage("RHEL-3"), e.PublishTriage("RHEL-4")}
	e.readAs(e.TriageStream(), "triage", "w1", 4)
	// RHEL-1: its holder works on this very entry. RHEL-2: held for another entry.
	// RHEL-3: nobody holds it (its consumer died). RHEL-4: the entry was deleted.
	l1, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w1", MessageID: ids[0]})
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Release(ctx)
	l2, err := locker.Acquire(ctx, "triage", "RHEL-2", lease.AcquireOptions{Owner: "w2", MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	e.Client.XDel(ctx, e.TriageStream(), ids[3])

	groups, err := in.Pending(ctx, inspect.PendingFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 {
		t.Fatalf("got %d groups, want only the existing triage group: %+v", len(groups), groups)
	}
	checkGuardedAndOrphaned(t, groups[0], e.TriageStream(), ids, l1.Fence())

	// The issue filter keeps the summary and lists only that issue's entries.
	groups, err = in.Pending(ctx, inspect.PendingFilter{Agent: "triage", Issue: "rhel-3"})
	if err != nil || len(groups) != 1 || groups[0].Count != 4 || len(groups[0].Entries) != 1 || groups[0].Entries[0].ID != ids[2] {
		t.Fatalf("Pending(RHEL-3) = %+v, %v", groups, err)
	}
	// JSON carries idle_ms and the lease's ttl_ms.
	b, _ := json.Marshal(groups[0].Entries[0])
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["state"] != "orphaned" || m["idle_ms"] == nil || m["issue"] != "RHEL-3" {
		t.Fatalf("JSON %s: %v", b, err)
	}
	// Groups that do not exist are not reported.
	if groups, err := in.Pending(ctx, inspect.PendingFilter{Agent: "rebase", Branch: "c9s"}); err != nil || len(groups) != 0 {
		t.Fatalf("Pending(rebase c9s) = %+v, %v", groups, err)
	}
}

// checkGuardedAndOrphaned checks TestPendingShowsGuardedAndOrphanedEntries' triage group
// g: its summary, and each entry's state, lease and note.
func checkGuardedAndOrphaned(t *testing.T, g inspect.GroupPending, stream string, ids []string, fence int64) {
	t.Helper()
	if g.Stream != stream || g.Group != "triage" || g.Count != 4 || g.Lowest != ids[0] || g.Highest != ids[3] ||
		len(g.Consumers) != 1 || g.Consumers[0] != (inspect.ConsumerPending{Name: "w1", Pending: 4}) || len(g.Entries) != 4 {
		t.Fatalf("group = %+v", g)
	}
	want := []struct{ issue, state, owner string }{
		{"RHEL-1", inspect.StateGuarded, "w1"}, {"RHEL-2", inspect.StateOrphaned, "w2"},
		{"RHEL-3", inspect.StateOrphaned, ""}, {"", inspect.StateOrphaned, ""},
	}
	for i, w := range want {
		got := g.Entries[i]
		owner := ""
		if got.Lease != nil {
			owner = got.Lease.Owner
		}
		if got.ID != ids[i] || got.Issue != w.issue || got.State != w.state || owner != w.owner || got.Consumer != "w1" || got.Deliveries != 1 {
			t.Errorf("entry %d = %+v (lease %+v), want %+v", i, got, got.Lease, w)
		}
	}
	if g.Entries[0].Lease.Fence != fence || g.Entries[0].Lease.TTL <= 0 || g.Entries[0].Lease.MessageID != ids[0] {
		t.Errorf("guarding lease = %+v", g.Entries[0].Lease)
	}
	if !strings.Contains(g.Entries[1].Note, "another entry") || !strings.Contains(g.Entries[3].Note, "no longer in the stream") {
		t.Errorf("notes = %q, %q", g.Entries[1].Note, g.Entries[3].Note)
	}
}

func TestLocksAndForceRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	locker := e.TriageLocker(time.Minute)
	in := e.inspector(locker, 0)
	held := map[string]*lease.Lease{}
	for _, r := range []lease.Ref{{Agent: "triage", Issue: "RHEL-1"}, {Agent: "rebase", Issue: "RHEL-1"}, {Agent: "triage", Issue: "RHEL-2"}} {
		le, err := locker.Acquire(ctx, r.Agent, r.Issue, lease.AcquireOptions{Owner: "pod-" + r.Agent, MessageID: "5-0"})
		if err != nil {
			t.Fatal(err)
		}
		defer le.Release(ctx)
		held[r.Agent+" "+r.Issue] = le
	}
	all, err := in.Locks(ctx, inspect.LockFilter{})
	if err != nil || len(all) != 3 {
		t.Fatalf("Locks = %+v, %v", all, err)
	}
	if all[0].Agent != "rebase" || all[0].Owner != "pod-rebase" || all[0].MessageID != "5-0" || all[0].TTL <= 0 || all[0].AcquiredAt.IsZero() {
		t.Fatalf("first lease = %+v", all[0])
	}
	byIssue, err := in.Locks(ctx, inspect.LockFilter{Issue: "rhel-1"})
	if err != nil || len(byIssue) != 2 || byIssue[0].Agent != "triage" || byIssue[1].Agent != "rebase" {
		t.Fatalf("Locks(RHEL-1) = %+v, %v", byIssue, err)
	}
	triage, err := in.Locks(ctx, inspect.LockFilter{Agent: "triage"})
	if err != nil || len(triage) != 2 {
		t.Fatalf("Locks(triage) = %+v, %v", triage, err)
	}

	old := held["triage RHEL-1"]
	rel, err := in.ForceRelease(asOperator(ctx), "triage", "rhel-1")
	if err != nil || rel.Holder == nil || rel.Holder.Owner != "pod-triage" || rel.Fence <= old.Fence() {
		t.Fatalf("ForceRelease = %+v, %v", rel, err)
	}
	// The old holder is fenced out: its next publish is refused.
	if _, err := old.XAdd(ctx, e.TriageStream(), 0, map[string]any{"x": "1"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("old holder's publish = %v, want ErrLeaseLost", err)
	}
	if _, err := in.Lease(ctx, "triage", "RHEL-1"); !errors.Is(err, inspect.ErrNotFound) {
		t.Fatalf("Lease after release = %v", err)
	}
	again, err := in.ForceRelease(asOperator(ctx), "triage", "RHEL-1")
	if err != nil || again.Holder != nil {
		t.Fatalf("second ForceRelease = %+v, %v", again, err)
	}
}

func TestStreamsReportsGroupsLagAndConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 0)
	first := e.PublishTriage("RHEL-1")
	e.PublishTriage("RHEL-2")
	last := e.PublishTriage("RHEL-3")
	e.readAs(e.TriageStream(), "triage", "w1", 1)
	e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Results(), Values: map[string]any{"event_type": "stage.done", "issue_key": "RHEL-1"}})

	streams, err := in.Streams(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(streams) != 2 {
		t.Fatalf("got %d streams, want triage and results: %+v", len(streams), streams)
	}
	s := streams[0]
	if s.Stream != e.TriageStream() || s.Kind != inspect.KindInput || s.Agent != "triage" || s.Length != 3 || s.FirstID != first || s.LastID != last || len(s.Groups) != 1 {
		t.Fatalf("triage = %+v", s)
	}
	g := s.Groups[0]
	if g.Name != "triage" || g.Lag != 2 || g.Pending != 1 || g.LastDeliveredID != first || len(g.Consumers) != 1 ||
		g.Consumers[0].Name != "w1" || g.Consumers[0].Pending != 1 || g.Consumers[0].Idle < 0 {
		t.Fatalf("group = %+v", g)
	}
	if streams[1].Kind != inspect.KindResults || streams[1].Length != 1 || len(streams[1].Groups) != 0 {
		t.Fatalf("results = %+v", streams[1])
	}
}

func TestHistoryOrdersEventsAcrossStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 2)
	c9s := e.Topology.Stream("rebase", "c9s", false)
	var want []string
	step := func(id string) {
		want = append(want, id)
		time.Sleep(2 * time.Millisecond) // distinct milliseconds: the order is the ids' time
	}
	step(e.PublishTriage("RHEL-7"))
	e.PublishTriage("RHEL-8")
	id, _ := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Results(), Values: map[string]any{
		"event_type": "stage.done", "agent": "triage", "issue_key": "RHEL-7", "fence": "3", "correlation_id": "c-1",
		"stream": e.TriageStream(), "message_id": want[0], "outcome": "rebase"}}).Result()
	step(id)
	step(e.publishTo(c9s, event.RebaseRequested, "rhel-7"))
	id, _ = e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Results(), Values: map[string]any{
		"event_type": "lock.dropped", "agent": "rebase", "issue_key": "RHEL-7", "holder": "w9", "holder_fence": "4", "holder_message_id": "9-9"}}).Result()
	step(id)
	id, _ = e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Dead(), Values: map[string]any{
		"_watermill_message_uuid": "u-1", "payload": `{"metadata":{"jira_issue":"RHEL-7"}}`, "m:issue_key": "RHEL-7",
		"m:event_type": "rebase.requested", event.DeadFieldStream: c9s, event.DeadFieldID: want[2],
		event.DeadFieldError: "boom", event.DeadFieldAttempts: "3", event.DeadFieldAgent: "rebase"}}).Result()
	step(id)
	step(e.PublishTriage("RHEL-7"))

	evs, err := in.History(ctx, " rhel-7")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, ev.ID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("history ids = %v, want %v\n%+v", got, want, evs)
	}
	types := []string{"triage.requested", "stage.done", "rebase.requested", "lock.dropped", "dead", "triage.requested"}
	streams := []string{e.TriageStream(), e.Topology.Results(), c9s, e.Topology.Results(), e.Topology.Dead(), e.TriageStream()}
	for i, ev := range evs {
		if ev.EventType != types[i] || ev.Stream != streams[i] || ev.Issue != "RHEL-7" || ev.Time.IsZero() {
			t.Errorf("event %d = %+v, want %s on %s", i, ev, types[i], streams[i])
		}
		if i > 0 && ev.Time.Before(evs[i-1].Time) {
			t.Errorf("event %d goes back in time", i)
		}
	}
	if evs[1].Fence != "3" || evs[1].CorrelationID != "c-1" || evs[1].Detail != "rebase" || evs[1].About != e.TriageStream()+" "+want[0] {
		t.Errorf("result = %+v", evs[1])
	}
	if evs[0].CorrelationID == "" || !strings.Contains(evs[3].Detail, "held by w9") || !strings.Contains(evs[4].Detail, "boom") {
		t.Errorf("details: %+v", evs)
	}
	if _, err := in.History(ctx, "not a key"); !errors.Is(err, lease.ErrInvalidKey) {
		t.Fatalf("History(bad key) = %v", err)
	}
}

func TestReplayOfARangeYieldsThatManyNewEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 2)
	var ids []string
	for _, k := range []string{"RHEL-1", "RHEL-2", "RHEL-1", "RHEL-3", "RHEL-1"} {
		ids = append(ids, e.PublishTriage(k))
	}
	originals, _ := e.Client.XRange(ctx, e.TriageStream(), "-", "+").Result()

	dry, err := in.Replay(asOperator(ctx), inspect.ReplayOptions{Stream: "triage", From: ids[1], To: ids[3], DryRun: true})
	if err != nil || len(dry.Events) != 3 || dry.Events[0].ID != "" || e.Client.XLen(ctx, e.TriageStream()).Val() != 5 {
		t.Fatalf("dry run = %+v, %v", dry, err)
	}
	rep, err := in.Replay(asOperator(ctx), inspect.ReplayOptions{Stream: e.TriageStream(), From: ids[1], To: ids[3]})
	if err != nil || len(rep.Events) != 3 {
		t.Fatalf("Replay = %+v, %v", rep, err)
	}
	all, _ := e.Client.XRange(ctx, e.TriageStream(), "-", "+").Result()
	if len(all) != 8 {
		t.Fatalf("stream has %d entries, want 5 + 3", len(all))
	}
	for i, m := range all[5:] {
		orig := originals[1+i]
		if m.Values["m:replay_of"] != orig.ID || rep.Events[i].ReplayOf != orig.ID || rep.Events[i].ID != m.ID {
			t.Errorf("replay %d: replay_of %v, want %s", i, m.Values["m:replay_of"], orig.ID)
		}
		if m.Values["m:correlation_id"] == orig.Values["m:correlation_id"] || m.Values["_watermill_message_uuid"] == orig.Values["_watermill_message_uuid"] {
			t.Errorf("replay %d kept the correlation id or uuid", i)
		}
		if m.Values["payload"] != orig.Values["payload"] || m.Values["m:issue_key"] != orig.Values["m:issue_key"] ||
			m.Values["m:event_type"] != "triage.requested" || m.Values["m:causation_id"] != orig.Values["_watermill_message_uuid"] {
			t.Errorf("replay %d = %v, original %v", i, m.Values, orig.Values)
		}
	}
	// The whole stream, one issue: the replays appended meanwhile are not replayed again.
	rep, err = in.Replay(asOperator(ctx), inspect.ReplayOptions{Stream: "triage", Issue: "rhel-1"})
	if err != nil || len(rep.Events) != 4 { // 3 originals + the replay of ids[2]
		t.Fatalf("Replay(RHEL-1) = %+v, %v", rep, err)
	}
	if n := e.Client.XLen(ctx, e.TriageStream()).Val(); n != 12 {
		t.Fatalf("stream has %d entries, want 12", n)
	}
	if _, err := in.Replay(asOperator(ctx), inspect.ReplayOptions{Stream: "results"}); err == nil {
		t.Fatal("replay of the results stream accepted")
	}
}

// A replay takes the normal path: a replay of a locked issue is dropped like any event.
func TestReplayOfALockedIssueIsDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r pipelinetest.Runs
	e.StartTriage(ctx, pipelinetest.TriageOptions{}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		return nil
	})
	e.PublishTriage("RHEL-5")
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-5") == 1 }, "first run")
	redistest.Eventually(t, 5*time.Second, func() bool { return e.Pending(e.TriageStream(), "triage") == 0 }, "released and acked")
	other := e.TriageLocker(time.Minute)
	le, err := other.Acquire(ctx, "triage", "RHEL-5", lease.AcquireOptions{Owner: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	rep, err := e.inspector(other, 0).Replay(asOperator(ctx), inspect.ReplayOptions{Stream: "triage"})
	if err != nil || len(rep.Events) != 1 {
		t.Fatalf("Replay = %+v, %v", rep, err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return len(e.Records(event.LockDropped)) == 1 }, "lock.dropped")
	if got := e.Records(event.LockDropped)[0].Values["message_id"]; got != rep.Events[0].ID {
		t.Fatalf("dropped %v, want the replay %s", got, rep.Events[0].ID)
	}
	if r.Get("RHEL-5") != 1 {
		t.Fatal("the replay of a locked issue ran")
	}
}

// bury writes a dead letter the way the DLQ middleware does and returns its id.
func (e *env) bury(stream, id, key, errText string) string {
	e.t.Helper()
	msgs, err := e.Client.XRangeN(context.Background(), stream, id, id, 1).Result()
	if err != nil || len(msgs) != 1 {
		e.t.Fatalf("read %s: %v", id, err)
	}
	v := msgs[0].Values
	v[event.DeadFieldStream], v[event.DeadFieldID], v[event.DeadFieldError] = stream, id, errText
	v[event.DeadFieldAttempts], v[event.DeadFieldAgent], v[event.DeadFieldAt] = "3", "triage", time.Now().UTC().Format(time.RFC3339Nano)
	dead, err := e.Client.XAdd(context.Background(), &redis.XAddArgs{Stream: e.Topology.Dead(), Values: v}).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return dead
}

func TestRequeueMovesAnEntryBackExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 0)
	orig := e.PublishTriage("RHEL-1")
	dead := e.bury(e.TriageStream(), orig, "RHEL-1", "boom")

	dl, err := in.DeadLetter(ctx, dead)
	if err != nil || dl.Stream != e.TriageStream() || dl.OriginalID != orig || dl.Error != "boom" || dl.Attempts != 3 ||
		dl.Issue != "RHEL-1" || dl.EventType != "triage.requested" || dl.Payload == "" || dl.Metadata["issue_key"] != "RHEL-1" {
		t.Fatalf("DeadLetter = %+v, %v", dl, err)
	}
	// Eight operators requeue the same entry at once: it moves once.
	var wg sync.WaitGroup
	var moved, notFound atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done, err := in.Requeue(asOperator(ctx), dead)
			moved.Add(int32(len(done)))
			if errors.Is(err, inspect.ErrNotFound) {
				notFound.Add(1)
			} else if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if moved.Load() != 1 || notFound.Load() != 7 {
		t.Fatalf("moved %d times, %d not found", moved.Load(), notFound.Load())
	}
	all, _ := e.Client.XRange(ctx, e.TriageStream(), "-", "+").Result()
	if len(all) != 2 || e.Client.XLen(ctx, e.Topology.Dead()).Val() != 0 {
		t.Fatalf("stream has %d entries, dead %d", len(all), e.Client.XLen(ctx, e.Topology.Dead()).Val())
	}
	for k, v := range all[0].Values {
		if all[1].Values[k] != v {
			t.Errorf("requeued %s = %v, want %v", k, all[1].Values[k], v)
		}
	}
	for k := range all[1].Values {
		if strings.HasPrefix(k, "dead_") {
			t.Errorf("requeued entry keeps %s", k)
		}
	}
	if _, err := in.DeadLetter(ctx, dead); !errors.Is(err, inspect.ErrNotFound) {
		t.Fatalf("DeadLetter after requeue = %v", err)
	}
}

func TestRequeueAllPurgeAndList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 2)
	var dead []string
	for _, k := range []string{"RHEL-1", "RHEL-2", "RHEL-1", "RHEL-3"} {
		dead = append(dead, e.bury(e.TriageStream(), e.PublishTriage(k), k, "boom "+k))
	}
	list, err := in.DeadLetters(ctx, inspect.DeadFilter{})
	if err != nil || len(list) != 4 || list[0].ID != dead[0] {
		t.Fatalf("DeadLetters = %+v, %v", list, err)
	}
	if list, err := in.DeadLetters(ctx, inspect.DeadFilter{Before: dead[2]}); err != nil || len(list) != 2 {
		t.Fatalf("DeadLetters(before) = %d, %v", len(list), err)
	}
	done, err := in.RequeueAll(asOperator(ctx), "rhel-1")
	if err != nil || len(done) != 2 || done[0].DeadID != dead[0] || done[1].DeadID != dead[2] || done[0].Stream != e.TriageStream() {
		t.Fatalf("RequeueAll(RHEL-1) = %+v, %v", done, err)
	}
	if n := e.Client.XLen(ctx, e.TriageStream()).Val(); n != 6 {
		t.Fatalf("triage has %d entries, want 4 + 2", n)
	}
	n, err := in.Purge(asOperator(ctx), dead[3])
	if err != nil || n != 1 {
		t.Fatalf("Purge(before) = %d, %v", n, err)
	}
	n, err = in.Purge(asOperator(ctx), "")
	if err != nil || n != 1 || e.Client.XLen(ctx, e.Topology.Dead()).Val() != 0 {
		t.Fatalf("Purge(all) = %d, %v", n, err)
	}
	if _, err := in.Requeue(asOperator(ctx), "nope"); !errors.Is(err, inspect.ErrBadID) {
		t.Fatalf("Requeue(nope) = %v", err)
	}
}

// End to end: an event that keeps failing is dead-lettered by the router; once the
// cause is fixed, a requeue runs it exactly once more.
func TestDeadLetterRequeueRerunsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r pipelinetest.Runs
	var broken atomic.Bool
	broken.Store(true)
	e.StartTriage(ctx, pipelinetest.TriageOptions{MaxRetries: 1}, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		if broken.Load() {
			return errBoom
		}
		return nil
	})
	e.PublishTriage("RHEL-6")
	redistest.Eventually(t, 5*time.Second, func() bool { return len(e.Dead()) == 1 }, "dead letter")
	runsBefore := r.Get("RHEL-6")
	broken.Store(false)
	in := e.inspector(nil, 0)
	done, err := in.Requeue(asOperator(ctx), e.Dead()[0].ID)
	if err != nil || len(done) != 1 {
		t.Fatalf("Requeue = %+v, %v", done, err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-6") == runsBefore+1 }, "one more run")
	redistest.Eventually(t, 5*time.Second, func() bool { return e.Pending(e.TriageStream(), "triage") == 0 }, "acked")
	time.Sleep(300 * time.Millisecond) // a window for a wrong extra run or dead letter to show
	if got := r.Get("RHEL-6"); got != runsBefore+1 || len(e.Dead()) != 0 {
		t.Fatalf("runs %d (before %d), dead %d", got, runsBefore, len(e.Dead()))
	}
}

// Requeue and Replay keep streams near MaxLen without cutting entries a group needs.
func TestRequeueAndReplayNeverTrimPendingEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in, err := inspect.New(inspect.Config{Client: e.Client, Topology: e.Topology, Locker: e.TriageLocker(time.Minute), MaxLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 5 {
		ids = append(ids, e.PublishTriage("RHEL-1"))
	}
	e.readAs(e.TriageStream(), "triage", "w1", 5)
	dead := e.bury(e.TriageStream(), ids[0], "RHEL-1", "boom")
	if _, err := in.Requeue(asOperator(ctx), dead); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Replay(asOperator(ctx), inspect.ReplayOptions{Stream: "triage", From: ids[0], To: ids[1]}); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if msgs, _ := e.Client.XRange(ctx, e.TriageStream(), id, id).Result(); len(msgs) != 1 {
			t.Fatalf("pending entry %s was trimmed", id)
		}
	}
}

// A lock.superseded record (policy supersede) reads in the timeline as what happened:
// the run cancelled by a newer entry, the event superseded while it waited, or the
// older event that met a newer run; each names the newer entry.
func TestHistoryShowsSupersededEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 0)
	for _, v := range []map[string]any{
		{"cancelled": "true", "ran": "true", "holder_message_id": "20-0", "holder_fence": "7"},
		{"cancelled": "true", "ran": "false", "holder_message_id": "30-0", "holder_fence": "8"},
		{"cancelled": "false", "ran": "false", "holder_message_id": "40-0", "holder_fence": "9", "holder": "w2"},
	} {
		v["event_type"], v["agent"], v["issue_key"], v["reason"] = event.LockSuperseded, "triage", "RHEL-9", "superseded"
		if err := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.Topology.Results(), Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := in.History(ctx, "RHEL-9")
	if err != nil || len(evs) != 3 {
		t.Fatalf("history: %+v, %v", evs, err)
	}
	for i, want := range []string{"cancelled: the newer entry 20-0 took the issue over (fence 7)",
		"superseded before it ran: the newer entry 30-0", "superseded by the newer entry 40-0; not run"} {
		if ev := evs[i]; ev.EventType != event.LockSuperseded || ev.Reason != "superseded" || !strings.Contains(ev.Detail, want) {
			t.Errorf("event %d: %+v, want detail %q", i, ev, want)
		}
	}
}
