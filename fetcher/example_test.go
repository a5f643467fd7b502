package fetcher_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func Example() {
	ctx := context.Background()
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(ctx, rdb, ns)
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}

	// A fake Jira: a fresh issue, a maintainer's ymir_todo, a retry, and an issue whose
	// triage is running right now (its lease is held).
	now := time.Now()
	maintainer := jira.User{AccountID: "maintainer"}
	srv := fakejira.New(fakejira.Options{
		Groups: map[string][]string{"maintainer": {"Red Hat Employee"}},
		Issues: []fakejira.Issue{
			{Key: "RHEL-1", Updated: now},
			{Key: "RHEL-2", Updated: now, Labels: []string{"ymir_todo"}, Changelog: []jira.ChangelogEntry{{
				Author: maintainer, Created: jira.Time{Time: now},
				Items: []jira.ChangeItem{{Field: "labels", ToString: "ymir_todo"}}}}},
			{Key: "RHEL-3", Updated: now, Labels: []string{"ymir_retry_needed"}},
			{Key: "RHEL-4", Updated: now, Labels: []string{"ymir_retry_needed"}},
		},
	})
	defer srv.Close()
	jc, _ := jira.New(jira.Options{BaseURL: srv.Start(), Token: "t", RateLimit: -1})
	locker, _ := lease.New(rdb, lease.Options{Scope: topo.LockScope()})
	le, _ := locker.Acquire(ctx, "triage", "RHEL-4", lease.AcquireOptions{})

	f, err := fetcher.New(fetcher.Config{
		Jira: jc, Redis: rdb, Topology: topo, Locker: locker,
		JQL: "project = RHEL", TriggerGroup: "Red Hat Employee", MaxLen: 100000,
	})
	if err != nil {
		panic(err)
	}
	sum, err := f.Sweep(ctx)
	if err != nil {
		panic(err)
	}
	for _, o := range sum.Issues {
		fmt.Printf("%s: published=%v %s%s labels=%v\n", o.Key, o.Published, strings.TrimPrefix(o.Stream, topo.Namespace+":"), o.Reason, srv.Labels(o.Key))
	}

	// The next sweep publishes nothing twice; after the lease is released, RHEL-4 goes.
	_, _ = le.Release(ctx)
	sum, _ = f.Sweep(ctx)
	fmt.Println("second sweep published", sum.PublishedKeys(), "queued", sum.Skipped[fetcher.ReasonQueued])
	// Output:
	// RHEL-1: published=true triage labels=[]
	// RHEL-2: published=true triage:todo labels=[ymir_triage_in_progress]
	// RHEL-3: published=true triage labels=[ymir_triage_in_progress]
	// RHEL-4: published=false locked labels=[ymir_retry_needed]
	// second sweep published [RHEL-4] queued 1
}
