package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// runLimited is a triage router under a run limit of rate, recording the issues run
// and the throttled count each run carried.
func runLimited(t *testing.T, e *pipelinetest.Env, rate ratelimit.Rate) (pipeline.RouterConfig, func() map[string][]string) {
	t.Helper()
	lim, err := ratelimit.New(ratelimit.Config{Client: e.Client, Prefix: e.Topology.Namespace + ":ratelimit:",
		Limits: map[string]ratelimit.Rate{"run:triage": rate}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string][]string{}
	cfg := e.Config("triage", "", "w1", e.TriageLocker(3*time.Second), func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		k := msg.Metadata.Get(event.MetaIssueKey)
		runs[k] = append(runs[k], msg.Metadata.Get(pipeline.MetaThrottled))
		return nil
	})
	cfg.RunLimit = &pipeline.RunLimit{Limiter: lim, Name: "run:triage"}
	return cfg, func() map[string][]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]string{}
		for k, v := range runs {
			out[k] = append([]string(nil), v...)
		}
		return out
	}
}

// Events over the run limit are not run and not lost: each is acked and waits in its
// stream's delayed set, marked throttled, until the budget has room.
func TestRunLimitRequeuesOverBudget(t *testing.T) {
	t.Parallel()
	e := pipelinetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, runs := runLimited(t, e, ratelimit.Rate{N: 1, Per: time.Hour, Burst: 2})
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	e.Start(ctx, cfg)
	for i := range 5 {
		e.PublishTriage(fmt.Sprintf("RHEL-%d", 70+i))
	}
	var waiting []delayq.Event
	redistest.Eventually(t, 10*time.Second, func() bool {
		waiting, _ = delayq.List(ctx, e.Client, e.TriageStream(), 0)
		return len(runs()) == 2 && len(waiting) == 3
	}, "2 runs and 3 re-queued (runs %v)", runs())
	for _, w := range waiting {
		if w.From == "" || w.Until.Before(time.Now().Add(20*time.Minute)) {
			t.Errorf("re-queued %+v: want its origin, due in about half an hour (1/h, burst 2)", w)
		}
	}
	if n := e.Pending(e.TriageStream(), e.Topology.Group("triage", "")); n != 0 {
		t.Errorf("%d entries still pending: re-queued ones must be acked", n)
	}
	seen := map[string]bool{}
	for k := range runs() {
		seen[k] = true
	}
	for _, w := range waiting {
		seen[w.IssueKey] = true
	}
	if len(seen) != 5 {
		t.Errorf("runs %v and waiting %+v do not account for the 5 events", runs(), waiting)
	}
	// Each re-queue is an event on its delivery's span.
	redistest.Eventually(t, 10*time.Second, func() bool {
		n := 0
		for _, sp := range exp.GetSpans() {
			for _, ev := range sp.Events {
				if ev.Name == "run.throttled" {
					n++
				}
			}
		}
		return n == 3
	}, "3 run.throttled span events")
}

// Re-queued events come back when the budget has room and each runs once.
func TestRunLimitRunsEveryEventOnce(t *testing.T) {
	t.Parallel()
	e := pipelinetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, runs := runLimited(t, e, ratelimit.Rate{N: 10, Per: time.Second, Burst: 1})
	e.Start(ctx, cfg)
	const n = 6
	for i := range n {
		e.PublishTriage(fmt.Sprintf("RHEL-%d", 80+i))
	}
	redistest.Eventually(t, 30*time.Second, func() bool { return len(runs()) == n }, "all %d events to run (runs %v)", n, runs())
	time.Sleep(300 * time.Millisecond) // a second run of one would come within the promote poll
	throttled := 0
	for k, r := range runs() {
		if len(r) != 1 {
			t.Errorf("%s ran %d times", k, len(r))
		}
		if r[0] != "" {
			throttled++
		}
	}
	if throttled == 0 {
		t.Error("no event was throttled: 6 events at once under a burst of 1")
	}
	if w, _ := delayq.List(ctx, e.Client, e.TriageStream(), 0); len(w) != 0 {
		t.Errorf("still waiting: %+v", w)
	}
}

func TestRunLimitRefusesUnknownLimit(t *testing.T) {
	t.Parallel()
	e := pipelinetest.New(t)
	lim, err := ratelimit.New(ratelimit.Config{Client: e.Client, Limits: map[string]ratelimit.Rate{"jira": {N: 1, Per: time.Second, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.Config("triage", "", "w1", e.TriageLocker(3*time.Second), func(*message.Message) error { return nil })
	cfg.RunLimit = &pipeline.RunLimit{Limiter: lim, Name: "run:triage"}
	if _, err := pipeline.NewRouter(cfg); err == nil || !strings.Contains(err.Error(), "RunLimit") {
		t.Errorf("NewRouter with an unknown limit: %v", err)
	}
}
