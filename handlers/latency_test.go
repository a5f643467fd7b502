package handlers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/runners"
)

// BenchmarkEndToEndLatency: one worker (a real router and the rebuild handler, fake
// Jira, the exec runner with a command as cheap as `true` that prints a success
// result), one event at a time, the next once the previous is acked. It times each
// event from just before `enqueue`'s XADD to the exec runner being called (it starts
// the agent's process at once: p50/p99-start) and to the agent's process having
// exited (p50/p99-exit), so the process start lies between the two:
//
//	go test -run '^$' -bench 'EndToEndLatency' -benchtime 1000x ./handlers/
//
// Beside it, the bare router's dispatch latency: BenchmarkRouterLatencyBare in
// ./pipeline/.
func BenchmarkEndToEndLatency(b *testing.B) {
	issues := make([]fakejira.Issue, b.N)
	for i := range issues {
		issues[i] = fakejira.Issue{Key: fmt.Sprintf("RHEL-%d", i+1), Labels: []string{"ymir_triaged_rebuild"}}
	}
	e := newEnv(b, issues...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type times struct{ called, exited time.Time }
	ran := make(chan times, 1)
	agent := runners.ExecRunner{Command: `echo '{"success": true}'`, KillGrace: time.Second}
	r := runners.RunnerFunc(func(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
		t := times{called: time.Now()}
		res, err := agent.Run(ctx, req)
		t.exited = time.Now()
		ran <- t
		return res, err
	})
	e.router(ctx, "rebuild", "c9s", e.handler("rebuild", "c9s", r), 3)
	stream := e.topo.Stream("rebuild", "c9s", false)
	var toStart, toExit []time.Duration
	b.ResetTimer()
	for i := range b.N {
		msg := downstreamMsg(b, "rebuild", issues[i].Key, "c9s", false)
		t0 := time.Now()
		if _, err := e.pub.PublishID(ctx, stream, msg); err != nil {
			b.Fatal(err)
		}
		select {
		case t := <-ran:
			toStart, toExit = append(toStart, t.called.Sub(t0)), append(toExit, t.exited.Sub(t0))
		case <-time.After(time.Minute):
			b.Fatalf("%s: the agent did not run", issues[i].Key)
		}
		for e.pendingOf(stream, "rebuild-c9s") > 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	b.StopTimer()
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(toStart, 0.50), "p50-start-µs")
	b.ReportMetric(pct(toStart, 0.99), "p99-start-µs")
	b.ReportMetric(pct(toExit, 0.50), "p50-exit-µs")
	b.ReportMetric(pct(toExit, 0.99), "p99-exit-µs")
	b.ReportMetric(0, "ns/op")
}
