package handlers_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/runners"
)

func TestDownstreamSuccessLabels(t *testing.T) {
	t.Parallel()
	for _, agent := range []string{"rebase", "backport", "rebuild"} {
		t.Run(agent, func(t *testing.T) {
			e := newEnv(t, fakejira.Issue{Key: "RHEL-20", Labels: []string{"ymir_triaged_" + agent, "ymir_" + agent + "_failed",
				"ymir_" + agent + "_errored", "cve"}})
			r := &fixed{res: runners.Result{Success: true, MergeRequestURL: "https://mr/1"}}
			h := e.handler(agent, "c9s", r)
			if err := attempt(h, downstreamMsg(t, agent, "RHEL-20", "rhel-9.6.0", false), 1); err != nil {
				t.Fatal(err)
			}
			e.wantLabels("RHEL-20", "cve", labels.DoneFor(agent))
			recs := e.recordsOf("RHEL-20", agent)
			if len(recs) != 1 || recs[0]["event_type"] != event.StageDone || recs[0]["outcome"] != labels.DoneFor(agent) {
				t.Fatalf("records %v", recs)
			}
			if d := detail(t, recs[0]); d["merge_request_url"] != "https://mr/1" || d["target_branch"] != "rhel-9.6.0" {
				t.Fatalf("detail %v", d)
			}
			if req := r.reqs[0]; req.Agent != agent || req.Branch != "c9s" || req.IssueKey != "RHEL-20" || req.Attempt != 1 {
				t.Fatalf("run request %+v", req)
			}
		})
	}
}

func TestDownstreamFailureLabels(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		r          *fixed
		user       bool
		midLabels  []string // after attempts 1 and 2
		lastLabels []string // after attempt 3
	}{
		{"clean failure, user-triggered", &fixed{res: runners.Result{Success: false, Error: "build failed"}}, true,
			[]string{"ymir_triaged_backport", "ymir_backport_failed"}, []string{"ymir_backport_errored"}},
		{"clean failure", &fixed{res: runners.Result{Success: false, Error: "build failed"}}, false,
			[]string{"ymir_triaged_backport"}, []string{"ymir_backport_errored"}},
		{"runner error, user-triggered", &fixed{err: errors.New("exit status 3")}, true,
			[]string{"ymir_triaged_backport"}, []string{"ymir_backport_errored"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, fakejira.Issue{Key: "RHEL-21", Labels: []string{"ymir_triaged_backport"}})
			h := e.handler("backport", "c10s", c.r)
			msg := downstreamMsg(t, "backport", "RHEL-21", "c10s", c.user)
			for n := 1; n <= 2; n++ {
				if err := attempt(h, msg, n); err == nil {
					t.Fatalf("attempt %d succeeded", n)
				}
				e.wantLabels("RHEL-21", c.midLabels...)
			}
			if len(e.records("")) != 0 {
				t.Fatalf("records before the last attempt: %v", e.records(""))
			}
			if err := attempt(h, msg, 3); err == nil {
				t.Fatal("last attempt succeeded")
			}
			e.wantLabels("RHEL-21", c.lastLabels...)
			recs := e.recordsOf("RHEL-21", "backport")
			if len(recs) != 1 || recs[0]["event_type"] != event.StageFailed || recs[0]["outcome"] != "ymir_backport_errored" {
				t.Fatalf("records %v", recs)
			}
			if c.r.n() != 3 {
				t.Fatalf("runner ran %d times", c.r.n())
			}
		})
	}
}

// A Jira outage while the success label is written: the runner's result is kept, the
// attempt fails and the next one writes the label without running the agent again.
func TestJiraOutageDuringLabelWriteIsRetriedWithoutRerun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-22", Labels: []string{"ymir_triaged_rebase"}})
	r := &fixed{res: runners.Result{Success: true}}
	// Jira goes down while the agent works.
	r.during = func(context.Context, runners.RunRequest) { e.fj.FailNext(5, http.StatusServiceUnavailable, "") }
	h := e.handler("rebase", "c9s", r)
	msg := downstreamMsg(t, "rebase", "RHEL-22", "c9s", false)
	// The client tries 3 times per call: the 5 failures outlast attempt 1...
	err := attempt(h, msg, 1)
	if err == nil || errors.Is(err, redeliver.ErrTransient) {
		t.Fatalf("attempt 1: %v, want a retryable error", err)
	}
	e.wantLabels("RHEL-22", "ymir_triaged_rebase")
	r.during = nil
	// ...and the outage ends during attempt 2.
	if err := attempt(h, msg, 2); err != nil {
		t.Fatalf("attempt 2: %v", err)
	}
	if r.n() != 1 {
		t.Fatalf("runner ran %d times, want 1", r.n())
	}
	e.wantLabels("RHEL-22", "ymir_rebased")
}

// Still down on the last attempt: the event is not dead-lettered but left pending
// (the error matches redeliver.ErrTransient, which the pipeline nacks).
func TestJiraDownOnLastAttemptLeavesEventPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-23", Labels: []string{"ymir_triaged_rebase"}})
	r := &fixed{res: runners.Result{Success: true}}
	h := e.handler("rebase", "c9s", r, func(c *handlers.Config) { c.MaxRetries = 1 })
	e.fj.FailNext(100, http.StatusBadGateway, "")
	err := attempt(h, downstreamMsg(t, "rebase", "RHEL-23", "c9s", false), 1)
	if !errors.Is(err, redeliver.ErrTransient) {
		t.Fatalf("err = %v, want one matching redeliver.ErrTransient", err)
	}
	if len(e.records("")) != 0 {
		t.Fatalf("records %v", e.records(""))
	}
}

// The fenced writes: once the lease is force-released (an operator, or expiry and a new
// holder), triage's resolution label write is refused before it is sent, so neither
// the label nor the downstream request exists.
func TestFencedPublishRefusedAfterForceRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-24"})
	locker := e.locker()
	r := &fixed{res: triageResult("backport", "rhel-9.6.0")}
	r.during = func(ctx context.Context, req runners.RunRequest) {
		if req.Fence == 0 {
			t.Error("runner got no fence")
		}
		if _, err := locker.ForceRelease(context.Background(), "triage", req.IssueKey); err != nil {
			t.Error(err)
		}
	}
	mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: locker, Agent: "triage"})
	if err != nil {
		t.Fatal(err)
	}
	triage := e.handler("triage", "", r)
	h := mw.Handler(func(msg *message.Message) ([]*message.Message, error) { return nil, triage(msg) })
	msg := triageMsg(t, "RHEL-24", false, "")
	msg.Metadata.Set(event.MetaAttempt, "1")
	_, err = h(msg)
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	stream := e.topo.Stream("backport", "c9s", false)
	if n := len(e.entries(stream)); n != 0 {
		t.Fatalf("%d entries in %s after a refused publish", n, stream)
	}
	// the claim is still on the issue, so the redelivery triages again
	e.wantLabels("RHEL-24", "ymir_triage_in_progress")
	if len(e.records("")) != 0 {
		t.Fatalf("records %v", e.records(""))
	}

	// The redelivery, under a new lease: the agent does not run again, the request is
	// published once, the labels end right.
	r.mu.Lock()
	r.during = nil
	r.mu.Unlock()
	msg.Metadata.Set(event.MetaAttempt, "2")
	if _, err := h(msg); err != nil {
		t.Fatal(err)
	}
	if r.n() != 1 {
		t.Fatalf("runner ran %d times", r.n())
	}
	ents := e.entries(stream)
	if len(ents) != 1 {
		t.Fatalf("%d entries in %s, want 1", len(ents), stream)
	}
	if f, first := ents[0].Values["m:fence"], r.reqs[0].Fence; f == "" || f == strconv.FormatInt(first, 10) {
		t.Fatalf("published with fence %v, want the new lease's (the first run's was %d)", f, first)
	}
	e.wantLabels("RHEL-24", "ymir_triaged_backport")
}

// Cancelling the handler's context (lease lost, shutdown) is not a failure: no labels,
// no records, and the error tells the pipeline to redeliver.
func TestCancelledRunIsNotAFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-25", Labels: []string{"ymir_triaged_rebuild"}})
	r := runners.RunnerFunc(func(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
		<-ctx.Done()
		return runners.Result{}, context.Cause(ctx)
	})
	h := e.handler("rebuild", "c9s", r, func(c *handlers.Config) { c.MaxRetries = 1 })
	msg := downstreamMsg(t, "rebuild", "RHEL-25", "c9s", true)
	ctx, cancel := context.WithCancel(context.Background())
	msg.SetContext(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	err := attempt(h, msg, 1)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	e.wantLabels("RHEL-25", "ymir_triaged_rebuild")
	if len(e.records("")) != 0 {
		t.Fatalf("records %v", e.records(""))
	}
}
