package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/fakellm"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// controlWorld is a control-channel test's Redis, fake Jira, fake LLM and binary.
type controlWorld struct {
	t      *testing.T
	bin    string
	py     kitAgent
	admin  *redis.Client
	topo   event.Topology
	jira   *fakejira.Server
	jiraTS *httptest.Server
	llm    *fakellm.Server
	llmURL string
	dir    string
	ledger *agentctl.Ledger
}

func newControlWorld(t *testing.T, issue string, llm fakellm.Options) *controlWorld {
	t.Helper()
	w := &controlWorld{t: t, py: kitAgents(t)[0], bin: buildBinary(t), dir: t.TempDir()}
	var ns string
	w.admin, ns = redistest.Client(t)
	w.topo = event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	w.jira = fakejira.New(fakejira.Options{Token: "kit-token", Issues: []fakejira.Issue{{Key: issue, Summary: "s"}}})
	w.jiraTS = httptest.NewServer(w.jira)
	t.Cleanup(w.jiraTS.Close)
	w.llm = fakellm.New(llm)
	url, err := w.llm.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.llm.Close)
	w.llmURL = url
	if w.ledger, err = agentctl.NewLedger(w.admin, w.topo.Namespace+":", agentctl.Budgets{}); err != nil {
		t.Fatal(err)
	}
	return w
}

// worker starts a worker process of agent (and branch) running the Python example
// agent with env (AGENT_* settings) and args.
func (w *controlWorld) worker(agent, branch, consumer string, env []string, args ...string) *proc {
	w.t.Helper()
	base := []string{"REDIS_URL=" + redistest.URL(), "AGENT_WORKDIR=" + w.dir, "AGENT_WORK_MS=10",
		"AGENT_RESOLUTION=not-affected", "AGENT_LLM_URL=" + w.llmURL}
	all := []string{"worker", "--agent", agent, "--runner", "exec", "--exec", w.py.command, "--runner-env", "AGENT_*",
		"--ymir-namespace", w.topo.Namespace, "--metrics-addr", "",
		"--lock-ttl", "3s", "--max-idle-time", "2s", "--claim-interval", "500ms", "--kill-grace", "300ms",
		"--jira-url", w.jiraTS.URL, "--jira-token", "kit-token", "--jira-rate-limit", "-1", "--block-time", "200ms",
		"--consumer-name", consumer}
	if branch != "" {
		all = append(all, "--branch", branch)
	}
	return startProc(w.t, w.bin, append(base, env...), append(all, args...)...)
}

// enqueue publishes a request of agent for issue with the binary.
func (w *controlWorld) enqueue(agent, branch, issue string) {
	w.t.Helper()
	args := []string{"enqueue", "--agent", agent, "--ymir-namespace", w.topo.Namespace}
	if branch != "" {
		args = append(args, "--branch", branch)
	}
	p := startProc(w.t, w.bin, []string{"REDIS_URL=" + redistest.URL()}, append(args, issue)...)
	if code := p.exit(30 * time.Second); code != 0 {
		w.t.Fatalf("enqueue: exit %d\n%s", code, p.stderr())
	}
}

// completed is the number of steps the last checkpoint of agent on issue lists.
func (w *controlWorld) completed(agent, issue string) int {
	ck, ok, err := w.ledger.LastCheckpoint(context.Background(), agent, issue)
	if err != nil || !ok {
		return 0
	}
	var c struct {
		Completed []string `json:"completed"`
	}
	_ = json.Unmarshal(ck.Data, &c)
	return len(c.Completed)
}

// Issue 39, done when: a scripted agent killed at 80 % (its worker SIGKILLed) resumes
// from its checkpoint in the retried run and re-spends under 10 % of the original.
func TestCheckpointResumeAfterSIGKILL(t *testing.T) {
	// Not parallel: it runs its own processes and times a lease's expiry.
	const issue, steps, cost = "RHEL-960", 20, 0.01
	w := newControlWorld(t, issue, fakellm.Options{CostUSD: cost, Delay: 100 * time.Millisecond})
	env := []string{"AGENT_STEPS=20", "AGENT_STEP_USD=0.01", "AGENT_MODEL=m"}
	a := w.worker("triage", "", "w1", env)
	w.enqueue("triage", "", issue)
	redistest.Eventually(t, 60*time.Second, func() bool { return w.completed("triage", issue) >= steps*8/10 },
		"the agent checkpoints 80 %% of its steps (worker log: %s)", a.stderr())
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.exit(10 * time.Second)
	atKill := w.completed("triage", issue)

	b := w.worker("triage", "", "w1", env)
	redistest.Eventually(t, 60*time.Second, func() bool {
		return len(records(context.Background(), w.admin, w.topo, event.StageDone, issue)) == 1
	}, "the retried run completes (worker log: %s)", b.stderr())
	if code, _ := b.stop(20 * time.Second); code != 0 {
		t.Fatalf("worker exit %d: %s", code, b.stderr())
	}
	original := steps * cost
	respent := w.llm.Spent() - original
	t.Logf("killed with %d of %d steps checkpointed; the LLM charged %.2f USD for %.2f of work: re-spent %.1f %%",
		atKill, steps, w.llm.Spent(), original, 100*respent/original)
	if respent >= original/10 {
		t.Fatalf("re-spent %.3f USD of %.2f (%.0f %%), want under 10 %%", respent, original, 100*respent/original)
	}
	if n := w.completed("triage", issue); n != steps {
		t.Fatalf("the last checkpoint lists %d steps, want %d", n, steps)
	}
	costs, err := w.ledger.Costs(context.Background(), issue)
	if err != nil || costs.Micro > agentctl.Micro(w.llm.Spent()) || costs.Reports < steps {
		t.Fatalf("ledger %+v (%v): want every counted call, counted once (LLM charged %.2f)", costs, err, w.llm.Spent())
	}
}

// Issue 39, done when: two agents on one issue against the fake LLM spend at most the
// budget plus one reservation, with a worker SIGKILLed mid-call and its run retried: no
// usage counted twice, only the killed call's lost; the Jira comment asking for more is
// posted once; an approval resumes both agents from their checkpoints and they complete.
func TestBudgetTwoAgentsSIGKILLAndApproval(t *testing.T) {
	// Not parallel: it runs its own processes and times a lease's expiry.
	const issue, step, budget = "RHEL-961", 0.10, 0.55
	w := newControlWorld(t, issue, fakellm.Options{CostUSD: step, Delay: 300 * time.Millisecond})
	budgetArgs := []string{"--budget-issue-usd", "0.55"}
	triageEnv := []string{"AGENT_STEPS=5", "AGENT_STEP_USD=0.10", "AGENT_MODEL=t"}
	rebaseEnv := []string{"AGENT_STEPS=5", "AGENT_STEP_USD=0.10", "AGENT_MODEL=r"}
	tw := w.worker("triage", "", "wt", triageEnv, budgetArgs...)
	rw := w.worker("rebase", "c9s", "wr", rebaseEnv, budgetArgs...)
	w.enqueue("triage", "", issue)
	w.enqueue("rebase", "c9s", issue)

	// SIGKILL the triage worker while its agent's call is in flight.
	redistest.Eventually(t, 60*time.Second, func() bool { return w.completed("triage", issue) >= 1 && w.llm.InFlight("t") > 0 },
		"the triage agent is mid-call after a step (worker log: %s)", tw.stderr())
	if err := tw.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	tw.exit(10 * time.Second)
	tw = w.worker("triage", "", "wt", triageEnv, budgetArgs...)

	exhausted := func(agent string) bool {
		for _, r := range records(context.Background(), w.admin, w.topo, "budget.exhausted", issue) {
			if r.Values["agent"] == agent {
				return true
			}
		}
		return false
	}
	redistest.Eventually(t, 90*time.Second, func() bool { return exhausted("triage") && exhausted("rebase") },
		"both agents end with budget.exhausted (triage log: %s\nrebase log: %s)", tw.stderr(), rw.stderr())
	costs, err := w.ledger.Costs(context.Background(), issue)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the LLM charged %.2f USD in %d calls; the ledger counted %.2f in %d reports (budget %.2f, one reservation %.2f)",
		w.llm.Spent(), w.llm.Calls(), costs.USD, costs.Reports, budget, step)
	if w.llm.Spent() > budget+step+1e-9 {
		t.Errorf("spent %.2f USD, over the budget %.2f plus one reservation %.2f", w.llm.Spent(), budget, step)
	}
	if costs.USD > budget+1e-9 || w.llm.Spent()-costs.USD > step+1e-9 || costs.Micro != agentctl.Micro(float64(costs.Reports)*step) {
		t.Errorf("ledger %+v: want every report counted once, at most the killed call lost (LLM %.2f)", costs, w.llm.Spent())
	}
	asks := 0
	for _, c := range w.jira.Comments(issue) {
		if strings.Contains(c.Body, "budget") {
			asks++
		}
	}
	if asks != 1 {
		t.Errorf("%d comments asking for more budget, want 1: %+v", asks, w.jira.Comments(issue))
	}
	if labels := strings.Join(w.jira.Labels(issue), ","); !strings.Contains(labels, "ymir_budget_exhausted") {
		t.Errorf("labels %s: want the issue parked", labels)
	}

	// The records are written under the leases: the resumed requests must find them
	// released (not dropped as busy).
	for _, agent := range []string{"triage", "rebase"} {
		lock := "lock:" + w.topo.LockScope() + agent + ":" + issue
		redistest.Eventually(t, 20*time.Second, func() bool { return w.admin.Exists(context.Background(), lock).Val() == 0 },
			"the %s lease released", agent)
	}

	// The approval: the budget is raised and both parked requests resume.
	p := startProc(t, w.bin, []string{"REDIS_URL=" + redistest.URL()}, "budget", "approve", issue, "--usd", "1",
		"--once", "jira-comment-1", "--reason", "maintainer approved", "--ymir-namespace", w.topo.Namespace)
	if code := p.exit(30 * time.Second); code != 0 || strings.Count(p.stdout(), "resumed") != 2 {
		t.Fatalf("budget approve: exit %d\n%s\n%s", code, p.stdout(), p.stderr())
	}
	redistest.Eventually(t, 90*time.Second, func() bool {
		return len(records(context.Background(), w.admin, w.topo, event.StageDone, issue)) == 2
	}, "both agents complete after the approval (triage log: %s\nrebase log: %s)", tw.stderr(), rw.stderr())
	if w.completed("triage", issue) != 5 || w.completed("rebase", issue) != 5 {
		t.Errorf("checkpoints list %d and %d steps, want 5 each", w.completed("triage", issue), w.completed("rebase", issue))
	}
	if w.llm.Spent() > budget+1+step+1e-9 {
		t.Errorf("spent %.2f USD, over the raised budget %.2f plus one reservation", w.llm.Spent(), budget+1)
	}
	for _, wk := range []*proc{tw, rw} {
		if code, _ := wk.stop(20 * time.Second); code != 0 {
			t.Errorf("worker exit %d: %s", code, wk.stderr())
		}
	}
}
