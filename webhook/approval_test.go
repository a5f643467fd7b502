package webhook

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// TestBudgetApprovalByComment: "/ymir budget +25" from someone outside the trigger
// group raises nothing and resumes nothing; from a maintainer it raises the issue's
// budget by 25 USD and publishes the parked request again, once: Jira's redelivery of
// the comment (another delivery id) adds nothing and publishes nothing.
func TestBudgetApprovalByComment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-39", "ymir_budget_exhausted")})
	ledger, err := agentctl.NewLedger(e.rdb, e.topo.Namespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	task := event.Task{}
	_ = task.Set("issue", "RHEL-39")
	payload, _ := json.Marshal(task)
	stream := e.topo.Stream("triage", "", true)
	if err := ledger.Park(e.ctx, "RHEL-39", agentctl.Parked{Agent: "triage", Stream: stream,
		EventType: event.TriageRequested, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	raised := func() float64 {
		c, err := ledger.Costs(e.ctx, "RHEL-39")
		if err != nil {
			t.Fatal(err)
		}
		return c.RaisedUSD
	}
	entries := func() int64 { return e.rdb.XLen(e.ctx, stream).Val() }

	if _, ok := e.jira.AddComment("RHEL-39", outsider, "/ymir budget +25"); !ok {
		t.Fatal("no issue")
	}
	e.waitDeliveries()
	if n := e.metrics.Count(http.StatusAccepted, "approval_untrusted"); n != 1 || raised() != 0 || entries() != 0 {
		t.Fatalf("outsider's approval: untrusted=%v raised=%v entries=%d, want 1, 0, 0", n, raised(), entries())
	}

	c, _ := e.jira.AddComment("RHEL-39", maintainer, "more please\n/ymir budget +25\n")
	e.waitDeliveries()
	if n := e.metrics.Count(http.StatusAccepted, "budget_raised"); n != 1 || raised() != 25 || entries() != 1 {
		t.Fatalf("maintainer's approval: raised_count=%v raised=%v entries=%d, want 1, 25, 1", n, raised(), entries())
	}
	xs, _ := e.rdb.XRange(e.ctx, stream, "-", "+").Result()
	msg := event.DecodeEntry(stream, xs[0].ID, xs[0].Values)
	if msg.Metadata.Get(event.MetaIssueKey) != "RHEL-39" || msg.Metadata.Get(event.MetaEventType) != event.TriageRequested {
		t.Fatalf("resumed request %v", msg.Metadata)
	}

	again, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": EventCommentCreated,
		"comment": map[string]any{"id": c.ID, "author": maintainer, "body": "/ymir budget +25"}, "issue": map[string]any{"key": "RHEL-39"}})
	if st, ans := e.post(again, signed(again, "redelivered")); st != http.StatusAccepted || ans["outcome"] != "budget_raised" {
		t.Fatalf("redelivery: %d %v", st, ans)
	}
	if raised() != 25 || entries() != 1 {
		t.Fatalf("after a redelivery: raised=%v entries=%d, want 25, 1", raised(), entries())
	}
}

// TestBudgetApprovalByLabel: with Config.ApprovalLabelUSD set, ymir_budget_approved
// added by a maintainer raises the budget by that amount once and resumes the parked
// request, and the receiver removes the label so that it can be added again (a second
// approval raises again); added by an outsider it raises nothing and is removed too.
// Without ApprovalLabelUSD the label is not an approval.
func TestBudgetApprovalByLabel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-40", labels.BudgetExhausted)},
		withConfig(func(c *Config) { c.ApprovalLabelUSD = 5 }))
	ledger, err := agentctl.NewLedger(e.rdb, e.topo.Namespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	stream := e.topo.Stream("rebase", "c10s", false)
	park := func() {
		task := event.Task{}
		_ = task.Set("jira_issue", "RHEL-40")
		_ = task.Set("target_branch", "c10s")
		payload, _ := json.Marshal(task)
		if err := ledger.Park(e.ctx, "RHEL-40", agentctl.Parked{Agent: "rebase", Stream: stream,
			EventType: event.RequestedEvent("rebase"), Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	raised := func() float64 { c, _ := ledger.Costs(e.ctx, "RHEL-40"); return c.RaisedUSD }
	entries := func() int64 { return e.rdb.XLen(e.ctx, stream).Val() }
	approve := func(by jira.User) {
		if !e.jira.ChangeLabels("RHEL-40", by, []string{labels.BudgetApproved}, nil) {
			t.Fatal("no issue")
		}
		e.waitDeliveries()
		if slices.Contains(e.jira.Labels("RHEL-40"), labels.BudgetApproved) {
			t.Fatalf("approval label left on the issue: %v", e.jira.Labels("RHEL-40"))
		}
	}

	park()
	approve(outsider)
	if raised() != 0 || entries() != 0 {
		t.Fatalf("outsider's label: raised=%v entries=%d, want 0, 0", raised(), entries())
	}
	approve(maintainer)
	if raised() != 5 || entries() != 1 {
		t.Fatalf("maintainer's label: raised=%v entries=%d, want 5, 1", raised(), entries())
	}
	park()
	approve(maintainer)
	if raised() != 10 || entries() != 2 {
		t.Fatalf("second approval: raised=%v entries=%d, want 10, 2", raised(), entries())
	}
	if n := e.metrics.Count(http.StatusAccepted, "budget_raised"); n != 2 {
		t.Fatalf("budget_raised = %v, want 2", n)
	}
}

// TestApprovalLabelOffByDefault: without ApprovalLabelUSD, ymir_budget_approved raises
// nothing; a bad ApprovalLabelUSD is refused by New.
func TestApprovalLabelOffByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-41", labels.BudgetExhausted)})
	e.jira.ChangeLabels("RHEL-41", maintainer, []string{labels.BudgetApproved}, nil)
	e.waitDeliveries()
	if n := e.metrics.Count(http.StatusAccepted, "budget_raised"); n != 0 {
		t.Fatalf("budget_raised = %v, want 0", n)
	}
	for _, v := range []float64{-1, agentctl.MaxCostUSD + 1} {
		cfg := e.rcv.cfg
		cfg.ApprovalLabelUSD = v
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "ApprovalLabelUSD") {
			t.Errorf("ApprovalLabelUSD %v: %v", v, err)
		}
	}
}
