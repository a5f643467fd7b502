package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/runners"
)

func TestRoutingTable(t *testing.T) {
	t.Parallel()
	topo := event.Topology{Namespace: "ymir"}
	cases := []struct {
		resolution, branch string
		todo               bool
		want               string // "" = no dispatch
	}{
		{"backport", "rhel-9.6.0", false, "ymir:backport:c9s"},
		{"backport", "RHEL-9.6", false, "ymir:backport:c9s"},
		{"rebase", "c8s", false, "ymir:rebase:c9s"},
		{"rebase", "rhel-8.10.0", false, "ymir:rebase:c9s"},
		{"rebuild", "c9s", false, "ymir:rebuild:c9s"},
		{"rebase", "rhel-10", false, "ymir:rebase:c10s"},
		{"backport", "rhel-10.1", false, "ymir:backport:c10s"},
		{"rebuild", "c10s", false, "ymir:rebuild:c10s"},
		{"backport", "main", false, "ymir:backport:c10s"},
		{"backport", "rhel-9.6.0", true, "ymir:backport:c9s:todo"},
		{"rebase", "c10s", true, "ymir:rebase:c10s:todo"},
		{"rebase", "", false, ""},
		{"backport", "  ", true, ""},
		{"clarification-needed", "c9s", false, ""},
		{"open-ended-analysis", "c9s", false, ""},
		{"postponed", "c9s", false, ""},
		{"not-affected", "c9s", false, ""},
		{"error", "c9s", false, ""},
	}
	for _, c := range cases {
		got, ok := handlers.Dispatch(topo, c.resolution, c.branch, c.todo)
		if ok != (c.want != "") || got != c.want {
			t.Errorf("Dispatch(%s, %q, todo=%v) = %q, %v; want %q", c.resolution, c.branch, c.todo, got, ok, c.want)
		}
	}
	labels := map[string]string{"rebase": "ymir_triaged_rebase", "backport": "ymir_triaged_backport",
		"rebuild": "ymir_triaged_rebuild", "clarification-needed": "ymir_needs_attention", "open-ended-analysis": "ymir_triaged",
		"postponed": "ymir_triaged_postponed", "not-affected": "ymir_triaged_not_affected", "error": ""}
	for res, want := range labels {
		if got := handlers.ResolutionLabel(res); got != want {
			t.Errorf("ResolutionLabel(%s) = %q, want %q", res, got, want)
		}
	}
}

// Every resolution against fakejira and Redis: the label, the stream, the downstream
// Task and the results record.
func TestTriageResolutions(t *testing.T) {
	t.Parallel()
	cases := []triageCase{
		{"backport rhel-9", "backport", "rhel-9.6.0", false, "ymir_triaged_backport", "backport:c9s"},
		{"rebase c8s", "rebase", "c8s", false, "ymir_triaged_rebase", "rebase:c9s"},
		{"rebuild rhel-10", "rebuild", "rhel-10.1", false, "ymir_triaged_rebuild", "rebuild:c10s"},
		{"backport user-triggered", "backport", "rhel-9.6.0", true, "ymir_triaged_backport", "backport:c9s:todo"},
		{"rebase without branch", "rebase", "", false, "ymir_triaged_rebase", ""},
		{"clarification", "clarification-needed", "", false, "ymir_needs_attention", ""},
		{"open-ended", "open-ended-analysis", "", false, "ymir_triaged", ""},
		{"postponed", "postponed", "", false, "ymir_triaged_postponed", ""},
		{"not-affected", "not-affected", "c9s", false, "ymir_triaged_not_affected", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { triageResolution(t, c) })
	}
}

// triageCase is one resolution of TestTriageResolutions.
type triageCase struct {
	name, resolution, branch string
	user                     bool
	label                    string
	stream                   string // agent:branch[:todo], "" = none
}

// triageResolution runs triage on RHEL-7 to resolution c and checks the labels (during
// and after the run), the streams, the results record and the downstream event.
func triageResolution(t *testing.T, c triageCase) {
	labels := []string{"ymir_todo", "cve"}
	if !c.user {
		labels = []string{"cve"}
	}
	e := newEnv(t, fakejira.Issue{Key: "RHEL-7", Labels: labels})
	r := &fixed{res: triageResult(c.resolution, c.branch)}
	r.res.Extra = map[string]json.RawMessage{"dist_git_namespace": json.RawMessage(`"rpms"`)}
	r.during = func(ctx context.Context, req runners.RunRequest) {
		// claimed while the runner runs: in_progress, trigger gone, one PUT
		if got := e.labels("RHEL-7"); !contains(got, "ymir_triage_in_progress") || contains(got, "ymir_todo") {
			t.Errorf("labels during the run: %v", got)
		}
	}
	h := e.handler("triage", "", r)
	msg := triageMsg(t, "rhel-7", c.user, `,"custom_field":{"x":1}`)
	if err := attempt(h, msg, 1); err != nil {
		t.Fatal(err)
	}
	e.wantLabels("RHEL-7", "cve", c.label)
	if r.n() != 1 {
		t.Fatalf("runner ran %d times", r.n())
	}
	var want []string
	if c.stream != "" {
		want = []string{e.topo.Namespace + ":" + c.stream}
	}
	got := e.streamsWithEntries()
	if len(got) != len(want) || (len(want) == 1 && got[0] != want[0]) {
		t.Fatalf("streams with entries %v, want %v", got, want)
	}
	recs := e.recordsOf("RHEL-7", "triage")
	if len(recs) != 1 || recs[0]["event_type"] != event.StageDone || recs[0]["outcome"] != c.resolution {
		t.Fatalf("results: %v", recs)
	}
	d := detail(t, recs[0])
	if d["label"] != c.label || d["data"].(map[string]any)["package"] != "pkg" {
		t.Fatalf("record detail %v", d)
	}
	if c.stream == "" {
		return
	}
	if d["stream"] != want[0] || d["stream_id"] == "" {
		t.Fatalf("record detail %v lacks the stream", d)
	}
	checkDownstream(t, e, c, msg, want[0])
}

// checkDownstream checks the one event of c's downstream stream: its metadata (type,
// issue, correlation, causation, user trigger) and Task, unknown fields kept.
func checkDownstream(t *testing.T, e *env, c triageCase, msg *message.Message, stream string) {
	t.Helper()
	ents := e.entries(stream)
	out := event.DecodeEntry(stream, ents[0].ID, ents[0].Values)
	if out.Metadata.Get(event.MetaEventType) != c.resolution+".requested" ||
		out.Metadata.Get(event.MetaIssueKey) != "RHEL-7" ||
		out.Metadata.Get(event.MetaCorrelationID) != msg.Metadata.Get(event.MetaCorrelationID) ||
		out.Metadata.Get(event.MetaCausationID) != msg.UUID ||
		out.Metadata.Get(event.MetaUserTriggered) != map[bool]string{true: "true", false: "false"}[c.user] {
		t.Fatalf("downstream metadata %v", out.Metadata)
	}
	task, err := event.ParseTask(out.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		Resolution string         `json:"resolution"`
		Data       map[string]any `json:"data"`
	}
	_ = json.Unmarshal(task.Metadata["triage_result"], &tr)
	if task.Str("jira_issue") != "RHEL-7" || task.Str("target_branch") != c.branch || tr.Resolution != c.resolution ||
		tr.Data["jira_issue"] != "RHEL-7" || tr.Data["package"] != "pkg" || task.Str("dist_git_namespace") != "rpms" ||
		task.UserTriggered != c.user || task.Attempts != 0 {
		t.Fatalf("downstream task %s", out.Payload)
	}
	// unknown fields survive, at the top and in metadata
	var all map[string]json.RawMessage
	_ = json.Unmarshal(out.Payload, &all)
	if string(all["origin"]) != `"test"` || string(task.Metadata["custom_field"]) != `{"x":1}` {
		t.Fatalf("unknown fields lost: %s", out.Payload)
	}
}

func TestTriageClaimIsOnePutRemovingOtherYmirLabels(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-8", Labels: []string{"ymir_todo", "ymir_triaged_backport", "ymir_backport_errored", "ymir_legacy_x", "keep"}})
	r := &fixed{res: triageResult("backport", "c9s")}
	var during []string
	r.during = func(context.Context, runners.RunRequest) { during = e.labels("RHEL-8") }
	h := e.handler("triage", "", r)
	if err := attempt(h, triageMsg(t, "RHEL-8", true, ""), 1); err != nil {
		t.Fatal(err)
	}
	if want := []string{"keep", "ymir_triage_in_progress"}; !equal(during, want) {
		t.Fatalf("after the claim: %v, want %v", during, want)
	}
	var writes []fakejira.Write
	for _, w := range e.fj.Writes() {
		if w.Method == "PUT" {
			writes = append(writes, w)
		}
	}
	if len(writes) != 3 { // claim, resolution label, unclaim
		t.Fatalf("%d label writes, want 3: %+v", len(writes), writes)
	}
	if !equal(sorted(writes[0].Add), []string{"ymir_triage_in_progress"}) ||
		!equal(sorted(writes[0].Remove), []string{"ymir_backport_errored", "ymir_legacy_x", "ymir_todo", "ymir_triaged_backport"}) {
		t.Fatalf("claim write %+v", writes[0])
	}
	// The resolution write asserts the issue's whole state (the claim stays until the
	// request is out); labels of other tools and the triggers are never touched.
	if !equal(writes[1].Add, []string{"ymir_triaged_backport"}) || contains(writes[1].Remove, "ymir_triage_in_progress") ||
		!contains(writes[1].Remove, "ymir_backported") || contains(writes[1].Remove, "keep") || contains(writes[1].Remove, "ymir_todo") ||
		len(writes[2].Add) != 0 || !equal(writes[2].Remove, []string{"ymir_triage_in_progress"}) {
		t.Fatalf("resolution writes %+v, %+v", writes[1], writes[2])
	}
	e.wantLabels("RHEL-8", "keep", "ymir_triaged_backport")
	if c := e.fj.Comments("RHEL-8"); len(c) != 1 {
		t.Fatalf("user-triggered run: %d comments, want the pick-up ack", len(c))
	}
}

func TestTriageDedup(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		labels []string
		status string
		user   bool
		runs   bool
		after  []string
	}{
		{"terminal label, no trigger: skip", []string{"ymir_triaged_backport"}, "New", false, false, []string{"ymir_triaged_backport"}},
		{"errored label, no trigger: skip", []string{"ymir_backport_errored", "x"}, "New", false, false, []string{"ymir_backport_errored", "x"}},
		{"terminal label + retry trigger: run", []string{"ymir_triaged_backport", "ymir_retry_needed"}, "New", false, true, []string{"ymir_triaged_rebase"}},
		{"terminal label + in progress: run", []string{"ymir_triaged_backport", "ymir_triage_in_progress"}, "New", false, true, []string{"ymir_triaged_rebase"}},
		{"terminal label, user-triggered: run", []string{"ymir_needs_attention"}, "New", true, true, []string{"ymir_triaged_rebase"}},
		{"sibling label is not terminal: run", []string{"ymir_rebase_sibling"}, "New", false, true, []string{"ymir_triaged_rebase"}},
		{"closed: skip", []string{"x"}, "Closed", false, false, []string{"x"}},
		{"done + fetcher flip: skip, claim removed", []string{"ymir_triage_in_progress"}, "Done", false, false, nil},
		{"closed, user-triggered: skip, trigger removed", []string{"ymir_todo", "ymir_triage_in_progress", "x"}, "Closed", true, false, []string{"x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, fakejira.Issue{Key: "RHEL-9", Labels: c.labels, Status: c.status})
			r := &fixed{res: triageResult("rebase", "")}
			h := e.handler("triage", "", r)
			if err := attempt(h, triageMsg(t, "RHEL-9", c.user, ""), 1); err != nil {
				t.Fatal(err)
			}
			if ran := r.n() == 1; ran != c.runs {
				t.Fatalf("runner ran: %v, want %v", ran, c.runs)
			}
			e.wantLabels("RHEL-9", c.after...)
			recs := e.recordsOf("RHEL-9", "triage")
			if len(recs) != 1 || recs[0]["event_type"] != event.StageDone {
				t.Fatalf("records %v", recs)
			}
			if !c.runs && recs[0]["outcome"] != "skipped" {
				t.Fatalf("skip recorded as %v", recs[0])
			}
			if c.user && c.status == "Closed" && len(e.fj.Comments("RHEL-9")) != 1 {
				t.Fatal("no comment telling the maintainer the issue is closed")
			}
		})
	}
}

func TestTriageFailureRetriesThenErrored(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		r    *fixed
	}{
		{"runner error", &fixed{err: errors.New("agent crashed")}},
		{"error resolution", &fixed{res: runners.Result{Resolution: "error", Data: json.RawMessage(`{"details":"no fix version"}`)}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, fakejira.Issue{Key: "RHEL-10", Labels: []string{"ymir_retry_needed"}})
			h := e.handler("triage", "", c.r)
			msg := triageMsg(t, "RHEL-10", false, "")
			for n := 1; n <= 2; n++ {
				if err := attempt(h, msg, n); err == nil {
					t.Fatalf("attempt %d succeeded", n)
				}
				e.wantLabels("RHEL-10", "ymir_triage_in_progress")
				if len(e.records("")) != 0 {
					t.Fatalf("a record before the last attempt: %v", e.records(""))
				}
			}
			err := attempt(h, msg, 3)
			if err == nil || errors.Is(err, event.ErrBadEvent) {
				t.Fatalf("last attempt: %v", err)
			}
			e.wantLabels("RHEL-10", "ymir_triage_errored")
			recs := e.recordsOf("RHEL-10", "triage")
			if len(recs) != 1 || recs[0]["event_type"] != event.StageFailed || recs[0]["outcome"] != "ymir_triage_errored" {
				t.Fatalf("records %v", recs)
			}
			if c.r.n() != 3 {
				t.Fatalf("runner ran %d times, want 3", c.r.n())
			}
			if got := e.streamsWithEntries(); len(got) != 0 {
				t.Fatalf("dispatched after a failure: %v", got)
			}
		})
	}
}

func TestTriageIssueMissingInJiraIsBadEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.handler("triage", "", &fixed{res: triageResult("rebase", "c9s")})
	if err := attempt(h, triageMsg(t, "RHEL-404", false, ""), 1); !errors.Is(err, event.ErrBadEvent) {
		t.Fatalf("err = %v, want ErrBadEvent", err)
	}
}

func TestNoJiraLogsInsteadOfWriting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-11", Labels: []string{"ymir_triaged_backport"}})
	r := &fixed{res: triageResult("backport", "c9s")}
	h := e.handler("triage", "", r, func(c *handlers.Config) { c.Jira = nil; c.DryRun = true })
	if err := attempt(h, triageMsg(t, "RHEL-11", false, ""), 1); err != nil {
		t.Fatal(err)
	}
	if r.n() != 1 || len(e.fj.Requests()) != 0 {
		t.Fatalf("runs %d, jira requests %d", r.n(), len(e.fj.Requests()))
	}
	if got := e.streamsWithEntries(); len(got) != 1 {
		t.Fatalf("streams %v", got)
	}
	// dry run with a Jira: reads are sent, writes are not
	h = e.handler("triage", "", r, func(c *handlers.Config) { c.DryRun = true })
	if err := attempt(h, triageMsg(t, "RHEL-11", true, ""), 1); err != nil {
		t.Fatal(err)
	}
	if len(e.fj.Writes()) != 0 || len(e.fj.Requests()) == 0 {
		t.Fatalf("dry run: writes %v", e.fj.Writes())
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for name, cfg := range map[string]handlers.Config{
		"unknown agent":      {Agent: "x", Runner: &fixed{}, Results: e.results},
		"triage with branch": {Agent: "triage", Branch: "c9s", Runner: &fixed{}, Results: e.results, Publisher: e.pub},
		"rebase no branch":   {Agent: "rebase", Runner: &fixed{}, Results: e.results},
		"no runner":          {Agent: "rebase", Branch: "c9s", Results: e.results},
		"no results":         {Agent: "rebase", Branch: "c9s", Runner: &fixed{}},
		"triage no pub":      {Agent: "triage", Runner: &fixed{}, Results: e.results},
		"negative retries":   {Agent: "rebase", Branch: "c9s", Runner: &fixed{}, Results: e.results, MaxRetries: -1},
	} {
		if _, err := handlers.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// orderJira records, at each label write, how many requests the downstream stream
// holds, and lets a test act just before a write.
type orderJira struct {
	*jira.Client
	e      *env
	stream string
	seen   []int64
	before func(n int)
}

func (o *orderJira) UpdateLabels(ctx context.Context, key string, add, remove []string) error {
	n, _ := o.e.rdb.XLen(ctx, o.stream).Result()
	o.seen = append(o.seen, n)
	if o.before != nil {
		o.before(len(o.seen))
	}
	return o.Client.UpdateLabels(ctx, key, add, remove)
}

// The resolution label is written before the request is published, and the claim
// removed after: a downstream agent that finishes before triage's last write still
// leaves the right labels.
func TestTriageLabelPublishOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-12"})
	stream := e.topo.Stream("backport", "c9s", false)
	oj := &orderJira{Client: e.jc, e: e, stream: stream}
	backport := e.handler("backport", "c9s", &fixed{res: runners.Result{Success: true}})
	oj.before = func(n int) {
		if n != 3 {
			return
		}
		// The fastest possible backport worker: done before triage removes its claim.
		ents := e.entries(stream)
		msg := event.DecodeEntry(stream, ents[0].ID, ents[0].Values)
		msg.Metadata.Set(event.MetaAttempt, "1")
		if err := backport(msg); err != nil {
			t.Error(err)
		}
	}
	h := e.handler("triage", "", &fixed{res: triageResult("backport", "c9s")}, func(c *handlers.Config) { c.Jira = oj })
	if err := attempt(h, triageMsg(t, "RHEL-12", false, ""), 1); err != nil {
		t.Fatal(err)
	}
	// claim and label before the publish, unclaim after (the backport's own write is 4th)
	if !slices.Equal(oj.seen[:3], []int64{0, 0, 1}) {
		t.Fatalf("stream length at each triage label write: %v, want [0 0 1]", oj.seen)
	}
	e.wantLabels("RHEL-12", "ymir_backported")
}

// A redelivery (new lease) of a triage whose runner already finished but whose outcome
// could not be recorded (the results stream refused the write) records the resolution,
// not a skip. The record is fenced, so it goes to the lease's Redis: the failure is made
// there (the stream's key holds a string for the first delivery).
func TestTriageRedeliveryAfterRecordFailureKeepsResolution(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-13"})
	rc := e.rdb
	runner := &fixed{res: triageResult("backport", "c9s")}
	h := e.handler("triage", "", runner)
	// Each delivery runs under its own lease, as the pipeline's lock middleware gives it.
	mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: e.locker(), Agent: "triage"})
	if err != nil {
		t.Fatal(err)
	}
	wrapped := mw.Handler(func(m *message.Message) ([]*message.Message, error) { return nil, h(m) })
	deliver := func() error {
		msg := triageMsg(t, "RHEL-13", false, "")
		msg.UUID = "same-event"
		msg.Metadata.Set(event.MetaAttempt, "1")
		_, err := wrapped(msg)
		return err
	}
	ctx := context.Background()
	rc.Set(ctx, e.topo.Results(), "not a stream", 0)
	if err := deliver(); err == nil {
		t.Fatal("recording into a key that is not a stream succeeded")
	}
	rc.Del(ctx, e.topo.Results())
	if err := deliver(); err != nil {
		t.Fatal(err)
	}
	recs := rc.XRange(context.Background(), e.topo.Results(), "-", "+").Val()
	if len(recs) != 1 || recs[0].Values["outcome"] != "backport" {
		t.Fatalf("results = %v, want one stage.done with outcome backport", recs)
	}
	if runner.calls != 1 {
		t.Fatalf("runner ran %d times", runner.calls)
	}
}
