package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// `cost` shows the ledger per issue, agent and day, as a table and as JSON; `history`
// ends with the issue's cost; `budget approve` raises once per named approval.
func TestCostHistoryAndBudgetCommands(t *testing.T) {
	for name := range config.EnvNames() {
		t.Setenv(name, "")
	}
	t.Setenv("REDIS_URL", redistest.URL())
	admin, ns := redistest.Client(t)
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	ctx := context.Background()
	lk, err := lease.New(admin, lease.Options{Scope: topo.LockScope(), TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := agentctl.NewLedger(admin, topo.Namespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	for i, agent := range []string{"triage", "rebase", "rebase"} {
		le, err := lk.Acquire(ctx, agent, "RHEL-77", lease.AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st, _, err := ledger.Report(ctx, agentctl.RunOf(le), 1, agentctl.Usage{Model: "m", Micro: int64(i+1) * 100_000, TokensIn: 10, TokensOut: 5, ToolCalls: 1}); err != nil || st != agentctl.StatusCounted {
			t.Fatalf("report: %s %v", st, err)
		}
		if _, err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cli := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(ctx, append(args, "--ymir-namespace", topo.Namespace), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		return out.String()
	}
	var rep costReport
	if err := json.Unmarshal([]byte(cli("cost", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Issues) != 1 || rep.Issues[0].USD != 0.6 || rep.Issues[0].Reports != 3 || len(rep.Rows) != 2 ||
		rep.Rows[0].Agent != "rebase" || rep.Rows[0].CostUSD != 0.5 || rep.Rows[0].Day != time.Now().UTC().Format("2006-01-02") {
		t.Fatalf("cost --json: %+v", rep)
	}
	if out := cli("cost", "rhel-77"); !strings.Contains(out, "0.6000") || !strings.Contains(out, "triage") {
		t.Fatalf("cost table:\n%s", out)
	}
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-77"}}`))
	msg, _ := event.New(event.TriageRequested, "RHEL-77", task, nil)
	if _, err := event.NewPublisher(admin, 0).PublishID(ctx, topo.Stream("triage", "", false), msg); err != nil {
		t.Fatal(err)
	}
	if out := cli("history", "RHEL-77"); !strings.Contains(out, "cost: 0.6000 USD in 3 reports (rebase 0.5000, triage 0.1000)") {
		t.Fatalf("history:\n%s", out)
	}
	for range 2 {
		if out := cli("budget", "approve", "RHEL-77", "--usd", "2.5", "--once", "c-1", "--reason", "maintainer approved"); !strings.Contains(out, "budget raised by 2.5000 USD in total") {
			t.Fatalf("budget approve:\n%s", out)
		}
	}
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"budget", "approve", "RHEL-77", "--usd", "-1", "--reason", "x"}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "--usd") {
		t.Fatalf("a negative approval: exit %d\n%s", code, errb.String())
	}
}
