package handlers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/tracing"
	"github.com/ymirflow/ymirflow/runners"
)

// scriptedAgent is a runner that speaks the control channel as an agent would: it
// resumes after the steps its Task's checkpoint lists, reserves, reports and
// checkpoints each step, and gives up (as the exec runner reports it) when denied.
type scriptedAgent struct {
	mu       sync.Mutex
	resumed  []int // steps done per run, from its Task JSON
	controls int   // runs that had a channel
}

func (a *scriptedAgent) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	var task struct {
		Checkpoint struct {
			Done int `json:"done"`
		} `json:"checkpoint"`
	}
	_ = json.Unmarshal(req.Payload, &task)
	a.mu.Lock()
	a.resumed = append(a.resumed, task.Checkpoint.Done)
	if req.Control != nil {
		a.controls++
	}
	a.mu.Unlock()
	if req.Control == nil {
		return runners.Result{}, nil
	}
	ours, theirs := net.Pipe()
	served := make(chan struct{})
	go func() { _ = req.Control.Serve(ctx, ours); _ = ours.Close(); close(served) }()
	var once sync.Once
	end := func() { once.Do(func() { _ = theirs.Close(); <-served }) }
	defer end()
	r := bufio.NewReader(theirs)
	seq := int64(0)
	ask := func(op string, fields string) string {
		seq++
		line := `{"id":"x","op":"` + op + `","fence":` + itoa64(req.Fence) + `,"seq":` + itoa64(seq) + fields + "}\n"
		if _, err := theirs.Write([]byte(line)); err != nil {
			return "closed"
		}
		raw, err := r.ReadBytes('\n')
		if err != nil {
			return "closed"
		}
		var ans struct{ Status string }
		_ = json.Unmarshal(raw, &ans)
		return ans.Status
	}
	for done := task.Checkpoint.Done; done < 3; done++ {
		if ask("reserve", `,"amount_usd":0.4`) != agentctl.StatusGranted {
			end()
			if req.Control.Exhausted() {
				return runners.Result{}, runners.ErrBudgetExhausted
			}
			return runners.Result{}, context.Canceled
		}
		ask("usage", `,"model":"m","cost_usd":0.4,"tokens_in":10`)
		ask("checkpoint", `,"checkpoint":{"done":`+itoa64(int64(done+1))+`}`)
	}
	return runners.Result{Success: true}, nil
}

// A run whose reservation is denied ends with budget.exhausted: the park label, one
// comment however often it happens at one budget level, the request parked; a raise
// publishes it again and the run resumes from its checkpoint to completion.
func TestBudgetExhaustedParksAndResumes(t *testing.T) {
	t.Parallel()
	const key = "RHEL-390"
	e := newEnv(t, fakejira.Issue{Key: key})
	ledger, err := agentctl.NewLedger(e.rdb, e.ns, agentctl.Budgets{Issue: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := &scriptedAgent{}
	e.router(ctx, "rebase", "c9s", e.handler("rebase", "c9s", agent, func(c *handlers.Config) { c.Ledger = ledger }), 3)

	exhausted := func() int { return len(e.records(handlers.BudgetExhausted)) }
	for n := 1; n <= 2; n++ {
		if _, err := e.pub.PublishID(ctx, e.topo.Stream("rebase", "c9s", false), downstreamMsg(t, "rebase", key, "c9s", false)); err != nil {
			t.Fatal(err)
		}
		redistest.Eventually(t, 20*time.Second, func() bool { return exhausted() == n }, "budget.exhausted recorded %d times", n)
		// The record is written under the lease: the next request must find it released
		// (not dropped as busy).
		lock := e.locker().LockKey("rebase", key)
		redistest.Eventually(t, 20*time.Second, func() bool { return e.rdb.Exists(ctx, lock).Val() == 0 }, "the lease released")
	}
	e.wantLabels(key, handlers.LabelBudgetExhausted)
	asks := 0
	for _, c := range e.fj.Comments(key) {
		if strings.Contains(c.Body, "budget") {
			asks++
		}
	}
	if asks != 1 {
		t.Fatalf("%d comments asking for budget, want 1", asks)
	}
	if rec := e.records(handlers.BudgetExhausted)[0]; rec["outcome"] != handlers.LabelBudgetExhausted || len(e.records(event.StageFailed)) != 0 {
		t.Fatalf("record %v: want the typed outcome, no failure", rec)
	}

	if _, err := ledger.Raise(ctx, key, 1, "approval-1"); err != nil {
		t.Fatal(err)
	}
	resumed, err := ledger.ResumeParked(ctx, key, func(ctx context.Context, p agentctl.Parked) (string, error) {
		task, _ := event.ParseTask(p.Payload)
		msg, err := event.New(p.EventType, key, task, nil)
		if err != nil {
			return "", err
		}
		return e.pub.PublishOnce(ctx, p.Stream, msg, p.OnceID(), agentctl.ParkedOnceTTL)
	})
	if err != nil || len(resumed) != 1 || resumed[0].Stream != e.topo.Stream("rebase", "c9s", false) || resumed[0].EntryID == "" {
		t.Fatalf("resumed %+v (%v), want the rebase request", resumed, err)
	}
	redistest.Eventually(t, 20*time.Second, func() bool { return contains(e.labels(key), labels.Rebased) }, "rebased after the raise")
	e.wantLabels(key, labels.Rebased) // the park label went with the resumed run's outcome
	agent.mu.Lock()
	defer agent.mu.Unlock()
	// Runs: 2 steps then denied; denied at once (resumed at 2); after the raise resumed at 2.
	if len(agent.resumed) != 3 || agent.resumed[1] != 2 || agent.resumed[2] != 2 || agent.controls != 3 {
		t.Fatalf("runs resumed at %v with %d channels, want [0 2 2] and 3", agent.resumed, agent.controls)
	}
	costs, _ := ledger.Costs(ctx, key)
	if costs.Micro != agentctl.Micro(1.2) {
		t.Fatalf("ledger %+v, want 3 steps of 0.4 counted", costs)
	}
}

// The runner's span carries what the run reported on its channel, counted.
func TestRunnerSpanCarriesCost(t *testing.T) {
	t.Parallel()
	const key = "RHEL-391"
	e := newEnv(t, fakejira.Issue{Key: key})
	ledger, err := agentctl.NewLedger(e.rdb, e.ns, agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewProvider(tracing.Config{Command: "test"}, sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := e.Config("rebase", "c9s", "w-span", e.locker(), e.handler("rebase", "c9s", &scriptedAgent{},
		func(c *handlers.Config) { c.Ledger, c.TracerProvider = ledger, tp }))
	cfg.Logger, cfg.TracerProvider = e.log, tp
	e.Start(ctx, cfg)
	if _, err := e.pub.PublishID(ctx, e.topo.Stream("rebase", "c9s", false), downstreamMsg(t, "rebase", key, "c9s", false)); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 20*time.Second, func() bool { return spanIndex(exp.GetSpans()).has("runner rebase") }, "the runner's span ended")
	sp := spanIndex(exp.GetSpans()).named(t, "runner rebase")
	if got := attrOf(sp, "ymirflow.cost_usd"); got != "1.2" {
		t.Errorf("ymirflow.cost_usd = %q, want 1.2 (three steps of 0.4)", got)
	}
	if got := attrOf(sp, "ymirflow.tokens_in"); got != "30" {
		t.Errorf("ymirflow.tokens_in = %q, want 30", got)
	}
}
