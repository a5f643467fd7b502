package handlers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The comment asking for more budget is posted at least once per budget level, and
// once: a run that died after marking the ask "asking" and before posting (its lease
// gone) is taken over, and the comment posted; one that died after posting and before
// marking it "asked" is found by the comment's marker, and nothing posted again.
func TestBudgetAskSurvivesACrash(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, key string
		posted    bool // the dead run posted before it died
	}{
		{"died before posting", "RHEL-395", false},
		{"died after posting", "RHEL-396", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, fakejira.Issue{Key: c.key})
			ledger, err := agentctl.NewLedger(e.rdb, e.ns, agentctl.Budgets{Issue: 0.1})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			// The dead run: it held the lease, marked the ask, (posted,) and died; its
			// lease is gone.
			dead, err := e.locker().Acquire(ctx, "rebase", c.key, lease.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ask, err := ledger.BeginAsk(ctx, c.key, agentctl.RunOf(dead), time.Hour)
			if err != nil || ask.Status != agentctl.AskPost {
				t.Fatalf("the dead run's ask: %+v, %v", ask, err)
			}
			if c.posted {
				e.fj.AddComment(c.key, jira.User{Name: "ymirflow"}, "budget exhausted, asking\n\n"+ask.Marker(c.key))
			}
			if _, err := dead.Release(ctx); err != nil {
				t.Fatal(err)
			}

			e.router(ctx, "rebase", "c9s", e.handler("rebase", "c9s", &scriptedAgent{}, func(c *handlers.Config) { c.Ledger = ledger }), 3)
			if _, err := e.pub.PublishID(ctx, e.topo.Stream("rebase", "c9s", false), downstreamMsg(t, "rebase", c.key, "c9s", false)); err != nil {
				t.Fatal(err)
			}
			redistest.Eventually(t, 20*time.Second, func() bool { return len(e.records(handlers.BudgetExhausted)) == 1 }, "budget.exhausted recorded")
			asks := 0
			for _, cm := range e.fj.Comments(c.key) {
				if strings.Contains(cm.Body, ask.Marker(c.key)) {
					asks++
				}
			}
			if asks != 1 {
				t.Fatalf("%d comments asking for budget, want 1: %+v", asks, e.fj.Comments(c.key))
			}
			if v := e.rdb.HGet(ctx, e.ns+"ctl:{"+c.key+"}:ledger", "ask:0").Val(); v != agentctl.AskAsked {
				t.Fatalf("the ask is %q, want it marked asked", v)
			}
		})
	}
}
