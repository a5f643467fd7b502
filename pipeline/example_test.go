package pipeline_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// One triage worker: the router reads the triage streams (the :todo twin and the main
// one) as consumer "worker-1-0" of group "triage" and runs the handler under each issue's
// lease, with retries, dead letters and the results log around it. Run returns when ctx
// is cancelled, with in-flight leases released and their entries left pending.
func ExampleNewRouter() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := redistest.URL() // e.g. redis://127.0.0.1:6379/0
	rdb, err := pipeline.Connect(ctx, url)
	if err != nil {
		panic(err)
	}
	defer rdb.Close()
	opts, err := pipeline.ClientOptions(url) // each subscriber opens its own client
	if err != nil {
		panic(err)
	}
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(context.Background(), rdb, ns)
	topo := event.Topology{Namespace: ns + "ymir"}

	locker, err := lease.New(rdb, lease.Options{Scope: topo.LockScope(), Owner: "worker-1"})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	router, err := pipeline.NewRouter(pipeline.RouterConfig{Client: rdb, ClientOptions: opts, Topology: topo,
		Agent: "triage", Consumer: "worker-1", Locker: locker,
		Handler: func(msg *message.Message) error {
			le, _ := lockmw.LeaseFrom(msg.Context())
			fmt.Println("triage of", msg.Metadata.Get(event.MetaIssueKey), "under fence", le.Fence())
			close(done)
			return nil
		}})
	if err != nil {
		panic(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- router.Run(ctx) }()
	<-router.Running()

	// What `ymirflow enqueue --agent triage RHEL-123` publishes.
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-123"}}`))
	msg, err := event.New(event.TriageRequested, "RHEL-123", task, nil)
	if err != nil {
		panic(err)
	}
	if err := event.NewPublisher(rdb, 0).Publish(topo.Stream("triage", "", false), msg); err != nil {
		panic(err)
	}
	<-done
	cancel()
	fmt.Println("stopped:", <-stopped)
	// Output:
	// triage of RHEL-123 under fence 1
	// stopped: <nil>
}
