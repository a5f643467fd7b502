package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/runners"
	"github.com/ymirflow/ymirflow/runners/demorunner"
)

// publishTriage writes a triage request as `ymirflow enqueue` does.
func (e *env) publishTriage(key string, userTriggered bool) {
	e.t.Helper()
	task := event.Task{UserTriggered: userTriggered}
	_ = task.Set("issue", key)
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.pub.PublishID(context.Background(), e.topo.Stream("triage", "", userTriggered), msg); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) pendingOf(stream, group string) int64 {
	p, err := e.rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		return 0
	}
	return p.Count
}

// Real routers, real Redis, fake Jira, demo agents: triage → rebase:c9s, labels and
// results at each step, the user-triggered issue through the :todo twins.
func TestEndToEndTriageToRebase(t *testing.T) {
	t.Parallel()
	var issues []fakejira.Issue
	for i := range 5 {
		issues = append(issues, fakejira.Issue{Key: fmt.Sprintf("RHEL-%d", 100+i), Labels: []string{"cve"}})
	}
	issues = append(issues, fakejira.Issue{Key: "RHEL-200", Labels: []string{"ymir_todo"}})
	e := newEnv(t, issues...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	triage := demorunner.Runner{Seed: 3, Duration: 20 * time.Millisecond, Mix: map[string]int{runners.ResolutionRebase: 1},
		Branches: []string{"rhel-9.6.0", "c8s", "c9s", "rhel-8.10.0"}}
	rebase := demorunner.Runner{Seed: 3, Duration: 20 * time.Millisecond, Mix: map[string]int{demorunner.Success: 1}}
	e.router(ctx, "triage", "", e.handler("triage", "", triage), 3)
	e.router(ctx, "rebase", "c9s", e.handler("rebase", "c9s", rebase), 3)

	for _, is := range issues[:5] {
		e.publishTriage(is.Key, false)
	}
	e.publishTriage("RHEL-200", true)

	for _, is := range issues {
		redistest.Eventually(t, 20*time.Second, func() bool { return contains(e.labels(is.Key), labels.Rebased) },
			"%s rebased (labels %v)", is.Key, e.labels(is.Key))
	}
	// The labels are set by the agent's run, the result records by its release just
	// after it: wait for those too before reading them.
	for _, is := range issues {
		redistest.Eventually(t, 10*time.Second, func() bool {
			return len(e.recordsOf(is.Key, "triage")) > 0 && len(e.recordsOf(is.Key, "rebase")) > 0
		}, "%s triage and rebase records", is.Key)
	}
	for _, is := range issues {
		want := []string{labels.Rebased}
		if is.Key != "RHEL-200" {
			want = append(want, "cve")
		}
		e.wantLabels(is.Key, want...)
		tr, rb := e.recordsOf(is.Key, "triage"), e.recordsOf(is.Key, "rebase")
		if len(tr) != 1 || tr[0]["event_type"] != event.StageDone || tr[0]["outcome"] != "rebase" {
			t.Fatalf("%s triage records %v", is.Key, tr)
		}
		if len(rb) != 1 || rb[0]["event_type"] != event.StageDone || rb[0]["outcome"] != labels.Rebased {
			t.Fatalf("%s rebase records %v", is.Key, rb)
		}
		if tr[0]["correlation_id"] != rb[0]["correlation_id"] || tr[0]["correlation_id"] == "" {
			t.Fatalf("%s: correlation id not kept across stages: %v / %v", is.Key, tr[0]["correlation_id"], rb[0]["correlation_id"])
		}
		if rb[0]["fence"] == "" {
			t.Fatalf("%s: no fence on the rebase record", is.Key)
		}
	}
	if n := len(e.entries(e.topo.Stream("rebase", "c9s", true))); n != 1 {
		t.Fatalf("%d entries in the rebase :todo stream, want the user-triggered one", n)
	}
	if n := len(e.entries(e.topo.Stream("rebase", "c9s", false))); n != 5 {
		t.Fatalf("%d entries in the rebase stream, want 5", n)
	}
	if n := len(e.entries(e.topo.Stream("rebase", "c10s", false))); n != 0 {
		t.Fatalf("%d entries routed to c10s", n)
	}
	if d := e.entries(e.topo.Dead()); len(d) != 0 {
		t.Fatalf("dead letters: %v", d)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		return e.pendingOf(e.topo.Stream("triage", "", false), "triage") == 0 &&
			e.pendingOf(e.topo.Stream("rebase", "c9s", false), "rebase-c9s") == 0
	}, "every entry acked")
}

// Retries exhausted through the router: _errored label, triaged label removed, the
// event in the dead-letter stream, a stage.failed record.
func TestEndToEndRetriesExhaustedGoToDead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-300", Labels: []string{"ymir_triaged_backport"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs atomic.Int32
	r := runners.RunnerFunc(func(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
		runs.Add(1)
		return runners.Result{Success: false, Error: fmt.Sprintf("build failed (attempt %d)", req.Attempt)}, nil
	})
	e.router(ctx, "backport", "c10s", e.handler("backport", "c10s", r, func(c *handlers.Config) { c.MaxRetries = 2 }), 2)
	msg := downstreamMsg(t, "backport", "RHEL-300", "rhel-10.1", true)
	if _, err := e.pub.PublishID(ctx, e.topo.Stream("backport", "c10s", true), msg); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.entries(e.topo.Dead())) == 1 }, "dead letter")
	dead := e.entries(e.topo.Dead())[0].Values
	if dead[event.DeadFieldAttempts] != "2" || !hasPrefix(dead[event.DeadFieldError].(string), "backport of RHEL-300 failed 2 times") {
		t.Fatalf("dead letter %v", dead)
	}
	e.wantLabels("RHEL-300", "ymir_backport_errored")
	recs := e.recordsOf("RHEL-300", "backport")
	if len(recs) != 1 || recs[0]["event_type"] != event.StageFailed || recs[0]["outcome"] != "ymir_backport_errored" {
		t.Fatalf("records %v", recs)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2", runs.Load())
	}
}

// A Jira 503 burst while triage writes its resolution label outlasts the client's
// retries and the event's attempts: the event is left pending, redelivered, and
// processed once Jira is back; the agent ran once and the downstream request was
// published once.
func TestEndToEndJiraOutageDuringLabelWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-400"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &fixed{res: triageResult("backport", "rhel-9.6.0")}
	r.during = func(context.Context, runners.RunRequest) { e.fj.FailNext(12, http.StatusServiceUnavailable, "") }
	e.router(ctx, "triage", "", e.handler("triage", "", r), 3)
	e.publishTriage("RHEL-400", false)
	redistest.Eventually(t, 20*time.Second, func() bool { return len(e.recordsOf("RHEL-400", "triage")) == 1 }, "triage recorded")
	e.wantLabels("RHEL-400", "ymir_triaged_backport")
	if r.n() != 1 {
		t.Fatalf("runner ran %d times, want 1", r.n())
	}
	if n := len(e.entries(e.topo.Stream("backport", "c9s", false))); n != 1 {
		t.Fatalf("%d downstream requests, want 1", n)
	}
	if d := e.entries(e.topo.Dead()); len(d) != 0 {
		t.Fatalf("dead-lettered during a Jira outage: %v", d)
	}
	failed := 0
	for _, req := range e.fj.Requests() {
		if req.Status == http.StatusServiceUnavailable {
			failed++
		}
	}
	if failed != 12 {
		t.Fatalf("%d failed requests, want the whole burst of 12", failed)
	}
}

// Two workers of one agent, the same issue published twice: the runs never overlap.
func TestEndToEndTwoWorkersOneIssueNeverOverlap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-500", Labels: []string{"ymir_triaged_rebuild"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	inFlight, maxInFlight, runs := 0, 0, 0
	r := runners.RunnerFunc(func(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
		mu.Lock()
		inFlight++
		runs++
		maxInFlight = max(maxInFlight, inFlight)
		mu.Unlock()
		time.Sleep(300 * time.Millisecond) // the point: a run long enough for the other worker's delivery to overlap it
		mu.Lock()
		inFlight--
		mu.Unlock()
		return runners.Result{Success: true}, nil
	})
	h := e.handler("rebuild", "c9s", r)
	for _, name := range []string{"a", "b"} {
		cfg := e.Config("rebuild", "c9s", name, e.locker(), h)
		cfg.Logger = e.log
		e.Start(ctx, cfg)
	}
	for range 2 {
		if _, err := e.pub.PublishID(ctx, e.topo.Stream("rebuild", "c9s", false), downstreamMsg(t, "rebuild", "RHEL-500", "c9s", false)); err != nil {
			t.Fatal(err)
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return len(e.recordsOf("RHEL-500", "rebuild")) == 2 && e.pendingOf(e.topo.Stream("rebuild", "c9s", false), "rebuild-c9s") == 0
	}, "both events settled (one run + one drop, or two runs in turn)")
	mu.Lock()
	defer mu.Unlock()
	if maxInFlight != 1 {
		t.Fatalf("%d runs of RHEL-500 overlapped", maxInFlight)
	}
	e.wantLabels("RHEL-500", "ymir_rebuilt")
}

// The exec runner behind a real router: output that is not a result is retried, then
// the event is dead-lettered with the runner's stderr and the issue gets its _errored
// label.
func TestEndToEndExecBadOutputRetriedThenDead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-600", Labels: []string{"ymir_triaged_rebuild"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := runners.ExecRunner{Command: `echo "attempt $YMIR_ATTEMPT of $YMIR_ISSUE_KEY" >&2; echo 'no json here'`, KillGrace: time.Second}
	e.router(ctx, "rebuild", "c9s", e.handler("rebuild", "c9s", r, func(c *handlers.Config) { c.MaxRetries = 2 }), 2)
	if _, err := e.pub.PublishID(ctx, e.topo.Stream("rebuild", "c9s", false), downstreamMsg(t, "rebuild", "RHEL-600", "c9s", false)); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.entries(e.topo.Dead())) == 1 }, "dead letter")
	dead := e.entries(e.topo.Dead())[0].Values
	msg := dead[event.DeadFieldError].(string)
	if !strings.Contains(msg, "not a valid result") || !strings.Contains(msg, "attempt 2 of RHEL-600") {
		t.Fatalf("dead letter error %q", msg)
	}
	e.wantLabels("RHEL-600", "ymir_rebuild_errored")
}
