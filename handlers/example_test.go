package handlers_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/runners"
)

func ExampleNew() {
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(context.Background(), rdb, ns)
	topo := event.Topology{Namespace: ns + "ymir"}

	fj := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1", Labels: []string{"ymir_todo"}}}})
	defer fj.Close()
	jc, _ := jira.New(jira.Options{BaseURL: fj.Start(), Token: "t", API: jira.APIServer})

	// A triage agent that always finds a backport for RHEL 9.
	agent := runners.RunnerFunc(func(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
		return runners.Result{Resolution: "backport", TargetBranch: "rhel-9.6.0", Data: []byte(`{"package":"curl"}`)}, nil
	})
	h, err := handlers.New(handlers.Config{Agent: "triage", Runner: agent, Jira: jc,
		Publisher: event.NewPublisher(rdb, 0), Results: event.NewResults(rdb, topo.Results(), 0), Topology: topo})
	if err != nil {
		panic(err)
	}
	// Normally pipeline.NewRouter calls h under the issue's lease; here, by hand.
	task := event.Task{UserTriggered: true}
	_ = task.Set("issue", "RHEL-1")
	msg, _ := event.New(event.TriageRequested, "RHEL-1", task, nil)
	if err := h(msg); err != nil {
		panic(err)
	}

	fmt.Println("labels:", fj.Labels("RHEL-1"))
	stream, _ := handlers.Dispatch(event.Topology{}, "backport", "rhel-9.6.0", true)
	fmt.Println("dispatched to:", stream)
	n, _ := rdb.XLen(context.Background(), topo.Stream("backport", "c9s", true)).Result()
	fmt.Println("requests waiting:", n)
	// Output:
	// labels: [ymir_triaged_backport]
	// dispatched to: ymir:backport:c9s:todo
	// requests waiting: 1
}
