package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// opsEnv runs the inspection commands in-process against this test's namespace of the
// test Redis (REDIS_URL, YMIR_NAMESPACE).
type opsEnv struct {
	t      *testing.T
	rdb    *redis.Client
	topo   event.Topology
	locker *lease.Locker
	pub    *event.Publisher
}

func newOpsEnv(t *testing.T) *opsEnv {
	rdb, ns := redistest.Client(t)
	for name := range config.EnvNames() {
		t.Setenv(name, "") // nothing leaks from the caller's environment
	}
	t.Setenv("REDIS_URL", redistest.URL())
	t.Setenv("YMIR_NAMESPACE", ns+"ymir")
	t.Setenv("LOG_LEVEL", "error")
	topo := event.Topology{Namespace: ns + "ymir"}
	locker, err := lease.New(rdb, lease.Options{Scope: topo.LockScope()})
	if err != nil {
		t.Fatal(err)
	}
	return &opsEnv{t: t, rdb: rdb, topo: topo, locker: locker, pub: event.NewPublisher(rdb, 0)}
}

// run runs `ymirflow args...` and returns its stdout, stderr and exit code.
func (o *opsEnv) run(args ...string) (string, string, int) {
	o.t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

// ok runs a command that must succeed.
func (o *opsEnv) ok(args ...string) string {
	o.t.Helper()
	out, errs, code := o.run(args...)
	if code != exitOK {
		o.t.Fatalf("ymirflow %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// json runs a command with --json and decodes its output into v.
func (o *opsEnv) json(v any, args ...string) {
	o.t.Helper()
	out := o.ok(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		o.t.Fatalf("ymirflow %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (o *opsEnv) code(want int, args ...string) string {
	o.t.Helper()
	out, errs, code := o.run(args...)
	if code != want {
		o.t.Fatalf("ymirflow %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, out, errs)
	}
	return errs
}

func (o *opsEnv) stream(agent, branch string) string { return o.topo.Stream(agent, branch, false) }

func (o *opsEnv) publish(stream, key string) string {
	o.t.Helper()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `","jira_issue":"` + key + `"}}`))
	et := event.TriageRequested
	if r, ok := o.topo.RouteOf(stream); ok {
		et = event.RequestedEvent(r.Agent)
	}
	msg, _ := event.New(et, key, task, nil)
	id, err := o.pub.PublishID(context.Background(), stream, msg)
	if err != nil {
		o.t.Fatal(err)
	}
	return id
}

func (o *opsEnv) read(stream, group, consumer string) {
	o.t.Helper()
	ctx := context.Background()
	o.rdb.XGroupCreateMkStream(ctx, stream, group, "0")
	if err := o.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer, Streams: []string{stream, ">"}}).Err(); err != nil {
		o.t.Fatal(err)
	}
}

func (o *opsEnv) acquire(agent, key, owner, id string) *lease.Lease {
	o.t.Helper()
	le, err := o.locker.Acquire(context.Background(), agent, key, lease.AcquireOptions{Owner: owner, MessageID: id})
	if err != nil {
		o.t.Fatal(err)
	}
	o.t.Cleanup(func() { le.Release(context.Background()) })
	return le
}

// withStdin makes confirmations read answer from a terminal (interactive) or not.
func withStdin(t *testing.T, answer string, interactive bool) {
	old := stdin
	stdin = func() (io.Reader, bool) { return strings.NewReader(answer), interactive }
	t.Cleanup(func() { stdin = old })
}

func TestHuman(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 350 * time.Millisecond: "350ms", 42 * time.Second: "42s", 90 * time.Second: "1m30s",
		2 * time.Minute: "2m", 2*time.Hour + 5*time.Minute + 10*time.Second: "2h5m", 76 * time.Hour: "3d4h", -3 * time.Second: "-3s",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestPendingCommand(t *testing.T) {
	o := newOpsEnv(t)
	triage := o.stream("triage", "")
	id1 := o.publish(triage, "RHEL-1")
	id2 := o.publish(triage, "RHEL-2")
	o.read(triage, "triage", "pod-a-0")
	o.acquire("triage", "RHEL-1", "pod-a-0", id1)

	out := o.ok("pending")
	for _, want := range []string{"STREAM", triage, "pod-a-0=2", id1, id2, "guarded", "orphaned", "RHEL-2"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var got struct {
		Groups []struct {
			Stream  string `json:"stream"`
			Count   int    `json:"count"`
			Entries []struct {
				ID         string `json:"id"`
				Consumer   string `json:"consumer"`
				IdleMS     *int64 `json:"idle_ms"`
				Deliveries int    `json:"deliveries"`
				Issue      string `json:"issue"`
				State      string `json:"state"`
				Lease      *struct {
					Owner     string `json:"owner"`
					Fence     int64  `json:"fence"`
					TTLMS     int64  `json:"ttl_ms"`
					MessageID string `json:"message_id"`
				} `json:"lease"`
			} `json:"entries"`
		} `json:"groups"`
	}
	o.json(&got, "pending", "--agent", "triage")
	if len(got.Groups) != 1 || got.Groups[0].Count != 2 || len(got.Groups[0].Entries) != 2 {
		t.Fatalf("JSON = %+v", got)
	}
	e1, e2 := got.Groups[0].Entries[0], got.Groups[0].Entries[1]
	if e1.State != "guarded" || e1.Lease == nil || e1.Lease.Owner != "pod-a-0" || e1.Lease.MessageID != id1 || e1.Lease.TTLMS <= 0 || e1.IdleMS == nil {
		t.Errorf("guarded entry = %+v", e1)
	}
	if e2.ID != id2 || e2.State != "orphaned" || e2.Lease != nil || e2.Issue != "RHEL-2" || e2.Consumer != "pod-a-0" || e2.Deliveries != 1 {
		t.Errorf("orphaned entry = %+v", e2)
	}
	o.json(&got, "pending", "--issue", "rhel-2")
	if len(got.Groups[0].Entries) != 1 || got.Groups[0].Entries[0].State != "orphaned" {
		t.Fatalf("--issue JSON = %+v", got)
	}
	o.code(exitUsage, "pending", "--agent", "nope")
	o.code(exitUsage, "pending", "--agent", "triage", "--branch", "c9s")
	o.code(exitUsage, "pending", "--issue", "../x")
	if out := o.ok("pending", "--help"); !strings.Contains(out, "Cost:") || !strings.Contains(out, "--issue") {
		t.Errorf("help:\n%s", out)
	}
}

func TestLocksCommand(t *testing.T) {
	o := newOpsEnv(t)
	old := o.acquire("triage", "RHEL-1", "pod-a-0", "1-0")
	o.acquire("rebase", "RHEL-1", "pod-b-0", "2-0")
	o.acquire("triage", "RHEL-2", "pod-a-1", "3-0")
	// Two follow-ups wait in RHEL-2's mailbox (ON_CONFLICT=deliver): the depth shows.
	for _, id := range []string{"4-0", "5-0"} {
		_, err := o.locker.Acquire(context.Background(), "triage", "RHEL-2", lease.AcquireOptions{MessageID: id,
			Deliver: &lease.DeliverOptions{Followup: map[string]any{"event_type": "triage.requested"},
				Event: lease.QueuedEvent{Stream: o.stream("triage", ""), Fields: map[string]any{"x": "1"}}}})
		if !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("deliver %s: %v", id, err)
		}
	}

	out := o.ok("locks")
	if !regexp.MustCompile(`RHEL-2 .* 2 +- +3-0`).MatchString(out) {
		t.Errorf("table does not show RHEL-2's mailbox depth 2:\n%s", out)
	}
	for _, want := range []string{"AGENT", "OWNER", "FENCE", "TTL", "MAILBOX", "pod-a-0", "pod-b-0", "pod-a-1", "RHEL-2", "3-0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var got struct {
		Leases []struct {
			Agent      string    `json:"agent"`
			Issue      string    `json:"issue"`
			Owner      string    `json:"owner"`
			Fence      int64     `json:"fence"`
			AcquiredAt time.Time `json:"acquired_at"`
			HeldMS     *int64    `json:"held_ms"`
			TTLMS      int64     `json:"ttl_ms"`
			MessageID  string    `json:"message_id"`
			Mailbox    int64     `json:"mailbox"`
		} `json:"leases"`
	}
	o.json(&got, "locks", "--issue", "RHEL-2")
	if len(got.Leases) != 1 || got.Leases[0].Mailbox != 2 {
		t.Fatalf("JSON of RHEL-2 = %+v, want mailbox 2", got)
	}
	o.json(&got, "locks", "--issue", "RHEL-1")
	if len(got.Leases) != 2 || got.Leases[0].Agent != "triage" || got.Leases[0].Owner != "pod-a-0" || got.Leases[0].Fence != old.Fence() ||
		got.Leases[0].TTLMS <= 0 || got.Leases[0].AcquiredAt.IsZero() || got.Leases[0].HeldMS == nil || got.Leases[1].Agent != "rebase" {
		t.Fatalf("JSON = %+v", got)
	}
	o.json(&got, "locks", "--agent", "triage")
	if len(got.Leases) != 2 {
		t.Fatalf("--agent triage = %+v", got)
	}

	// Release: refused without a terminal and without --yes; declined at the prompt.
	withStdin(t, "", false)
	if errs := o.code(exitUsage, "locks", "release", "triage", "RHEL-1", "--reason", "a test"); !strings.Contains(errs, "--yes") {
		t.Errorf("stderr: %s", errs)
	}
	withStdin(t, "n\n", true)
	o.code(exitRuntime, "locks", "release", "triage", "RHEL-1", "--reason", "a test")
	if old.Check(context.Background()) != nil {
		t.Fatal("lease released without confirmation")
	}
	withStdin(t, "y\n", true)
	// It says what comes of it: the entry runs again (issue 35).
	if out := o.ok("locks", "release", "triage", "RHEL-1", "--reason", "a test"); !strings.Contains(out, "fenced out") ||
		!strings.Contains(out, "its run stops within a second, and entry ") || !strings.Contains(out, "runs again right after") {
		t.Errorf("release output: %s", out)
	}
	if help, _, _ := o.run("locks", "--help"); !strings.Contains(help, "the entry runs again right after") {
		t.Errorf("locks --help does not say the entry runs again:\n%s", help)
	}
	// The old holder is fenced out: its next publish is refused.
	if _, err := old.XAdd(context.Background(), o.stream("rebase", "c9s"), 0, map[string]any{"x": "1"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("old holder's publish = %v, want ErrLeaseLost", err)
	}
	var rel struct {
		Agent  string `json:"agent"`
		Issue  string `json:"issue"`
		Holder *struct {
			Owner string `json:"owner"`
			Fence int64  `json:"fence"`
		} `json:"holder"`
		Fence int64 `json:"fence"`
	}
	withStdin(t, "", false)
	o.json(&rel, "locks", "release", "rebase", "rhel-1", "--yes", "--reason", "a test")
	if rel.Holder == nil || rel.Holder.Owner != "pod-b-0" || rel.Fence <= rel.Holder.Fence || rel.Issue != "RHEL-1" {
		t.Fatalf("release JSON = %+v", rel)
	}
	o.json(&rel, "locks", "release", "rebase", "RHEL-1", "--yes", "--reason", "a test")
	if rel.Holder != nil {
		t.Fatalf("second release JSON = %+v", rel)
	}
	o.code(exitUsage, "locks", "release", "nope", "RHEL-1", "--yes")
	o.code(exitUsage, "locks", "release", "triage")
}

func TestStreamsCommand(t *testing.T) {
	o := newOpsEnv(t)
	triage := o.stream("triage", "")
	first := o.publish(triage, "RHEL-1")
	o.publish(triage, "RHEL-2")
	o.read(triage, "triage", "pod-a-0")
	o.publish(triage, "RHEL-3")
	o.publish(o.stream("rebase", "c10s"), "RHEL-4")

	out := o.ok("streams")
	for _, want := range []string{"LAG", triage, o.stream("rebase", "c10s"), "pod-a-0(2, ", first} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var got struct {
		Streams []struct {
			Stream  string `json:"stream"`
			Kind    string `json:"kind"`
			Length  int64  `json:"length"`
			FirstID string `json:"first_id"`
			Groups  []struct {
				Name      string `json:"name"`
				Lag       int64  `json:"lag"`
				Pending   int64  `json:"pending"`
				Consumers []struct {
					Name    string `json:"name"`
					Pending int64  `json:"pending"`
					IdleMS  *int64 `json:"idle_ms"`
				} `json:"consumers"`
			} `json:"groups"`
		} `json:"streams"`
	}
	o.json(&got, "streams")
	if len(got.Streams) != 2 {
		t.Fatalf("JSON = %+v", got)
	}
	s := got.Streams[0]
	if s.Stream != triage || s.Kind != "input" || s.Length != 3 || s.FirstID != first || len(s.Groups) != 1 ||
		s.Groups[0].Lag != 1 || s.Groups[0].Pending != 2 || len(s.Groups[0].Consumers) != 1 || s.Groups[0].Consumers[0].IdleMS == nil {
		t.Fatalf("triage = %+v", s)
	}
	o.code(exitUsage, "streams", "extra")
}

func TestHistoryCommand(t *testing.T) {
	o := newOpsEnv(t)
	ctx := context.Background()
	var want []string
	want = append(want, o.publish(o.stream("triage", ""), "RHEL-7"))
	time.Sleep(2 * time.Millisecond) // distinct milliseconds: the history is in the ids' time order
	o.publish(o.stream("triage", ""), "RHEL-8")
	id, _ := o.rdb.XAdd(ctx, &redis.XAddArgs{Stream: o.topo.Results(), Values: map[string]any{
		"event_type": "stage.done", "agent": "triage", "issue_key": "RHEL-7", "fence": "4", "correlation_id": "corr-1", "outcome": "rebase",
		"detail": `{"target_branch":"c10s","package":"glibc","reason":"CVE fix needed","merge_request_url":null}`}}).Result()
	want = append(want, id)
	time.Sleep(2 * time.Millisecond) // distinct milliseconds, as above
	want = append(want, o.publish(o.stream("rebase", "c9s"), "RHEL-7"))

	// Flags after the key work too.
	var got struct {
		Issue  string `json:"issue"`
		Events []struct {
			Time          time.Time `json:"time"`
			Stream        string    `json:"stream"`
			ID            string    `json:"id"`
			EventType     string    `json:"event_type"`
			Fence         string    `json:"fence"`
			CorrelationID string    `json:"correlation_id"`
		} `json:"events"`
	}
	o.json(&got, "history", "rhel-7")
	if got.Issue != "RHEL-7" || len(got.Events) != 3 {
		t.Fatalf("JSON = %+v", got)
	}
	types := []string{"triage.requested", "stage.done", "rebase.requested"}
	for i, ev := range got.Events {
		if ev.ID != want[i] || ev.EventType != types[i] || ev.Time.IsZero() {
			t.Errorf("event %d = %+v, want %s %s", i, ev, want[i], types[i])
		}
	}
	if got.Events[1].Fence != "4" || got.Events[1].CorrelationID != "corr-1" || got.Events[1].Stream != o.topo.Results() {
		t.Errorf("result = %+v", got.Events[1])
	}
	out := o.ok("history", "RHEL-7")
	// DETAIL is key=value, not raw JSON (issue 35).
	if !strings.Contains(out, `rebase; package=glibc reason="CVE fix needed" target_branch=c10s`) || strings.Contains(out, `{"`) {
		t.Errorf("history DETAIL is not key=value:\n%s", out)
	}
	if !strings.Contains(out, "EVENT") || strings.Index(out, "triage.requested") > strings.Index(out, "rebase.requested") || !strings.Contains(out, "corr-1") {
		t.Errorf("table:\n%s", out)
	}
	// The hand-made XADD to the results stream is in no index: the results stream is
	// scanned, and the output says so; the requests came from the index.
	if !strings.Contains(out, "note: scanned 1 entries older than the per-issue index") || !strings.Contains(out, "1 stream(s): "+o.topo.Results()+"\n") {
		t.Errorf("no note of the scan:\n%s", out)
	}
	if out := o.ok("history", "RHEL-99"); !strings.Contains(out, "no events") {
		t.Errorf("empty history: %s", out)
	}
	o.code(exitUsage, "history")
	o.code(exitUsage, "history", "not a key")
}

func TestReplayCommand(t *testing.T) {
	o := newOpsEnv(t)
	ctx := context.Background()
	triage := o.stream("triage", "")
	ids := []string{o.publish(triage, "RHEL-1"), o.publish(triage, "RHEL-2"), o.publish(triage, "RHEL-3")}

	out := o.ok("replay", "--stream", "triage", "--dry-run")
	if !strings.Contains(out, "would replay 3 event(s)") || o.rdb.XLen(ctx, triage).Val() != 3 {
		t.Fatalf("dry run:\n%s", out)
	}
	var rep struct {
		Stream string `json:"stream"`
		DryRun bool   `json:"dry_run"`
		Events []struct {
			ReplayOf      string `json:"replay_of"`
			ID            string `json:"id"`
			Issue         string `json:"issue"`
			CorrelationID string `json:"correlation_id"`
		} `json:"events"`
	}
	o.json(&rep, "replay", "--stream", triage, "--from", ids[0], "--to", ids[1], "--reason", "a test")
	if rep.Stream != triage || rep.DryRun || len(rep.Events) != 2 || rep.Events[0].ReplayOf != ids[0] || rep.Events[1].ReplayOf != ids[1] ||
		rep.Events[0].ID == "" || rep.Events[0].CorrelationID == "" {
		t.Fatalf("JSON = %+v", rep)
	}
	all, _ := o.rdb.XRange(ctx, triage, "-", "+").Result()
	if len(all) != 5 || all[3].Values["m:replay_of"] != ids[0] || all[4].Values["m:replay_of"] != ids[1] {
		t.Fatalf("stream after replay: %d entries", len(all))
	}
	out = o.ok("replay", "--stream", "triage", "--issue", "RHEL-3", "--reason", "a test")
	if !strings.Contains(out, "replayed 1 event(s)") || !strings.Contains(out, ids[2]) {
		t.Fatalf("table:\n%s", out)
	}
	// A whole stream needs a confirmation.
	withStdin(t, "", false)
	o.code(exitUsage, "replay", "--stream", "triage", "--reason", "a test")
	if n := o.rdb.XLen(ctx, triage).Val(); n != 6 {
		t.Fatalf("stream has %d entries, want 6", n)
	}
	o.code(exitUsage, "replay", "--stream", "results")
	o.code(exitUsage, "replay")
	o.code(exitUsage, "replay", "--stream", "triage", "--from", "yesterday")
}

func (o *opsEnv) bury(stream, key, reason string) string {
	o.t.Helper()
	ctx := context.Background()
	id := o.publish(stream, key)
	msgs, _ := o.rdb.XRange(ctx, stream, id, id).Result()
	v := msgs[0].Values
	v[event.DeadFieldStream], v[event.DeadFieldID], v[event.DeadFieldError] = stream, id, reason
	v[event.DeadFieldAttempts], v[event.DeadFieldAgent], v[event.DeadFieldAt] = "3", "triage", time.Now().UTC().Format(time.RFC3339Nano)
	dead, err := o.rdb.XAdd(ctx, &redis.XAddArgs{Stream: o.topo.Dead(), Values: v}).Result()
	if err != nil {
		o.t.Fatal(err)
	}
	return dead
}

// The list shows the end of an agent's stderr, where it says why it failed, after what
// failed (issue 35): the head of a long stderr is progress lines.
func TestDLQListShowsTheEndOfTheStderr(t *testing.T) {
	o := newOpsEnv(t)
	o.bury(o.stream("triage", ""), "RHEL-3", "exec runner: exit status 1; stderr: "+
		strings.Repeat("INFO cloning and building the package\n", 40)+"FATAL: patch 0003 does not apply")
	out := o.ok("dlq", "list")
	if !strings.Contains(out, "exec runner: exit status 1; stderr: …") || !strings.Contains(out, "FATAL: patch 0003 does not apply\n") {
		t.Fatalf("list lacks the start and the end of the error:\n%s", out)
	}
}

func TestDLQCommand(t *testing.T) {
	o := newOpsEnv(t)
	ctx := context.Background()
	triage := o.stream("triage", "")
	d1 := o.bury(triage, "RHEL-1", "runner exited 1")
	d2 := o.bury(triage, "RHEL-2", "runner printed bad JSON")
	d3 := o.bury(triage, "RHEL-2", "runner exited 2")

	out := o.ok("dlq", "list")
	for _, want := range []string{"ERROR", d1, d2, "runner printed bad JSON", "3 dead letter(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}
	var list struct {
		DeadLetters []struct {
			ID         string `json:"id"`
			Stream     string `json:"stream"`
			OriginalID string `json:"original_id"`
			Error      string `json:"error"`
			Attempts   int    `json:"attempts"`
			Issue      string `json:"issue"`
			EventType  string `json:"event_type"`
		} `json:"dead_letters"`
	}
	o.json(&list, "dlq", "list", "--issue", "RHEL-2")
	if len(list.DeadLetters) != 2 || list.DeadLetters[0].ID != d2 || list.DeadLetters[0].Stream != triage ||
		list.DeadLetters[0].Attempts != 3 || list.DeadLetters[0].EventType != "triage.requested" || list.DeadLetters[0].OriginalID == "" {
		t.Fatalf("list JSON = %+v", list)
	}
	var show struct {
		ID       string            `json:"id"`
		Error    string            `json:"error"`
		Metadata map[string]string `json:"metadata"`
		Payload  string            `json:"payload"`
	}
	o.json(&show, "dlq", "show", d1)
	if show.ID != d1 || show.Error != "runner exited 1" || show.Metadata["issue_key"] != "RHEL-1" || !strings.Contains(show.Payload, "RHEL-1") {
		t.Fatalf("show JSON = %+v", show)
	}
	if out := o.ok("dlq", "show", d1); !strings.Contains(out, "m:issue_key") || !strings.Contains(out, "payload") {
		t.Errorf("show table:\n%s", out)
	}

	// Requeue moves the entry back exactly once.
	if out := o.ok("dlq", "requeue", d1, "--reason", "a test"); !strings.Contains(out, "requeued 1 dead letter(s)") {
		t.Errorf("requeue:\n%s", out)
	}
	if errs := o.code(exitRuntime, "dlq", "requeue", d1, "--reason", "a test"); !strings.Contains(errs, "not found") {
		t.Errorf("second requeue stderr: %s", errs)
	}
	if n := o.rdb.XLen(ctx, triage).Val(); n != 4 {
		t.Fatalf("triage has %d entries, want 3 + 1", n)
	}
	var req struct {
		Requeued []struct {
			DeadID string `json:"dead_id"`
			Stream string `json:"stream"`
			ID     string `json:"id"`
			Issue  string `json:"issue"`
		} `json:"requeued"`
		Errors []string `json:"errors"`
	}
	o.json(&req, "dlq", "requeue", "--all", "--issue", "RHEL-2", "--reason", "a test")
	if len(req.Requeued) != 2 || req.Requeued[0].DeadID != d2 || req.Requeued[1].DeadID != d3 || req.Requeued[0].Stream != triage || len(req.Errors) != 0 {
		t.Fatalf("requeue --all JSON = %+v", req)
	}

	d4 := o.bury(triage, "RHEL-4", "boom")
	o.bury(triage, "RHEL-5", "boom")
	withStdin(t, "", false)
	o.code(exitUsage, "dlq", "purge", "--reason", "a test")
	var purged struct {
		Purged int `json:"purged"`
	}
	o.json(&purged, "dlq", "purge", "--before", d4, "--yes", "--reason", "a test")
	if purged.Purged != 0 {
		t.Fatalf("purge before the first = %+v", purged)
	}
	withStdin(t, "yes\n", true)
	if out := o.ok("dlq", "purge", "--reason", "a test"); !strings.Contains(out, "purged 2") || o.rdb.XLen(ctx, o.topo.Dead()).Val() != 0 {
		t.Fatalf("purge:\n%s", out)
	}

	o.code(exitUsage, "dlq")
	o.code(exitUsage, "dlq", "bury")
	o.code(exitUsage, "dlq", "show")
	o.code(exitUsage, "dlq", "show", "x-y")
	o.code(exitUsage, "dlq", "requeue")
	o.code(exitUsage, "dlq", "requeue", d4, "--all")
	o.code(exitUsage, "dlq", "list", "--before", "soon")
}

// Events re-queued by the busy policy delay show in `pending` with when they run again,
// and in its JSON; a lease with a shared scope shows in `locks` with its scope and key.
func TestPendingShowsDelayedAndLocksShowScopes(t *testing.T) {
	o := newOpsEnv(t)
	ctx := context.Background()
	triage := o.stream("triage", "")
	o.publish(triage, "RHEL-5")
	o.read(triage, "triage", "pod-a-0")
	until := time.Now().Add(time.Hour).UTC()
	member, err := delayq.Member("1-1", map[string]any{"payload": "{}", "m:issue_key": "RHEL-6",
		"m:event_type": event.TriageRequested, "m:delays": "2", "m:correlation_id": "corr-6"})
	if err != nil {
		t.Fatal(err)
	}
	o.rdb.ZAdd(ctx, delayq.Key(triage), redis.Z{Score: float64(until.UnixMilli()), Member: member})
	out := o.ok("pending")
	for _, want := range []string{"DELAYED UNTIL", "RHEL-6", until.Format("2006-01-02 15:04"), "corr-6"} {
		if !strings.Contains(out, want) {
			t.Errorf("pending lacks %q:\n%s", want, out)
		}
	}
	var got struct {
		Groups []struct {
			Delayed []struct {
				Until  time.Time `json:"delayed_until"`
				Issue  string    `json:"issue_key"`
				Delays int       `json:"delays"`
			} `json:"delayed"`
		} `json:"groups"`
	}
	o.json(&got, "pending", "--agent", "triage")
	if len(got.Groups) != 1 || len(got.Groups[0].Delayed) != 1 || got.Groups[0].Delayed[0].Issue != "RHEL-6" ||
		got.Groups[0].Delayed[0].Delays != 2 || !got.Groups[0].Delayed[0].Until.Equal(until.Truncate(time.Millisecond)) {
		t.Fatalf("JSON = %+v", got)
	}

	le, err := o.locker.Acquire(ctx, "rebase", "RHEL-7", lease.AcquireOptions{Owner: "pod-b",
		Shared: []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-7"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	out = o.ok("locks")
	for _, want := range []string{"SCOPE", "KEY", "agent", "issue", "pod-b"} {
		if !strings.Contains(out, want) {
			t.Errorf("locks lacks %q:\n%s", want, out)
		}
	}
	var locks struct {
		Leases []struct {
			Agent, Issue, Scope, Key string
		} `json:"leases"`
	}
	o.json(&locks, "locks", "--issue", "RHEL-7")
	if len(locks.Leases) != 2 || locks.Leases[1].Scope != "issue" || locks.Leases[1].Key != "RHEL-7" || locks.Leases[1].Agent != "rebase" {
		t.Errorf("locks --issue JSON = %+v", locks)
	}
}

// Issue 37: the wait policy's line shows in locks ("2 waiting, oldest ...") and in
// pending (WAITING FOR), though its events are acked.
func TestLocksAndPendingShowTheLine(t *testing.T) {
	o := newOpsEnv(t)
	ctx := context.Background()
	wait := func(id string) lease.AcquireOptions {
		return lease.AcquireOptions{Owner: "pod-w-0", MessageID: id, Wait: &lease.WaitOptions{LineID: id,
			Event: lease.QueuedEvent{Stream: o.stream("rebase", "c9s"), Fields: map[string]any{"x": "1"}}}}
	}
	holder, err := o.locker.Acquire(ctx, "rebase", "RHEL-9", wait("1-0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = holder.Release(context.Background()) })
	for _, id := range []string{"2-0", "3-0"} {
		if _, err := o.locker.Acquire(ctx, "rebase", "RHEL-9", wait(id)); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("event %s: %v", id, err)
		}
	}
	if out := o.ok("locks"); !regexp.MustCompile(`RHEL-9 .* 0 +2 waiting, oldest \d+s +1-0`).MatchString(out) {
		t.Errorf("locks does not show the line:\n%s", out)
	}
	if out := o.ok("pending"); !regexp.MustCompile(`WAITING FOR[\s\S]*rebase +RHEL-9 +2 waiting, oldest \d+s +pod-w-0`).MatchString(out) {
		t.Errorf("pending does not show the line:\n%s", out)
	}
}
