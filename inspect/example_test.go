package inspect_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// An operator asks why RHEL-2 is not being worked on: its entry is pending with a
// consumer that holds no lease for it (orphaned), so it is claimed and re-run once it
// has been idle for MAX_IDLE_TIME. Its history shows the one request; a replay
// re-publishes it with replay_of set.
func ExampleInspector() {
	ctx := context.Background()
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(ctx, rdb, ns)

	topo := event.Topology{Namespace: ns + "ymir"}
	locker, _ := lease.New(rdb, lease.Options{Scope: topo.LockScope()}) // the workers' scope and format
	in, err := inspect.New(inspect.Config{Client: rdb, Topology: topo, Locker: locker})
	if err != nil {
		panic(err)
	}

	// Two triage requests, both read by worker-0, which holds the lease of RHEL-1 only.
	pub := event.NewPublisher(rdb, 0)
	stream := topo.Stream("triage", "", false)
	ids := map[string]string{}
	for _, key := range []string{"RHEL-1", "RHEL-2"} {
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
		msg, _ := event.New(event.TriageRequested, key, task, nil)
		ids[key], _ = pub.PublishID(ctx, stream, msg)
	}
	rdb.XGroupCreateMkStream(ctx, stream, "triage", "0")
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "worker-0", Streams: []string{stream, ">"}})
	le, _ := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "worker-0", MessageID: ids["RHEL-1"]})
	defer le.Release(ctx)

	groups, _ := in.Pending(ctx, inspect.PendingFilter{Agent: "triage"})
	for _, g := range groups {
		fmt.Println(strings.TrimPrefix(g.Stream, ns), "group", g.Group, "pending", g.Count)
		for _, e := range g.Entries {
			fmt.Println(" ", e.Issue, e.Consumer, e.State)
		}
	}
	history, _ := in.History(ctx, "rhel-2")
	for _, ev := range history {
		fmt.Println("history:", ev.EventType, strings.TrimPrefix(ev.Stream, ns))
	}
	// A write names its operator and why: the audit trail records it before it runs.
	op := audit.WithOperator(ctx, audit.Operator{Who: "alice@laptop", From: "cli laptop", Reason: "agent fixed"})
	rep, _ := in.Replay(op, inspect.ReplayOptions{Stream: "triage", Issue: "RHEL-2"})
	fmt.Println("replayed:", len(rep.Events), rep.Events[0].ReplayOf == ids["RHEL-2"])
	// Output:
	// ymir:triage group triage pending 2
	//   RHEL-1 worker-0 guarded
	//   RHEL-2 worker-0 orphaned
	// history: triage.requested ymir:triage
	// replayed: 1 true
}
