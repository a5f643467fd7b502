package pipeline_test

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// BenchmarkMemoryPerIssue runs 2 000 issues through a triage worker on a Redis server of
// its own, as a day of traffic would: each issue's request is published, run under its
// lease, publishes a rebase request (fenced) and records its outcome. Then it weighs
// every key the run left (MEMORY USAGE), by kind, and reports the bytes per issue of each
// kind and of all, and per stream entry. Run it once:
//
//	go test -run '^$' -bench MemoryPerIssue -benchtime 1x -v ./pipeline/
func BenchmarkMemoryPerIssue(b *testing.B) {
	const issues = 2000
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	e := newEnvOn(b, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := event.NewResults(e.rdb, e.topo.Results(), 0)
	rebase := e.topo.Stream("rebase", "c9s", false)
	for b.Loop() {
		e.start(ctx, routerOpts{TTL: 30 * time.Second, MaxIdle: time.Minute, Concurrency: 4}, func(msg *message.Message) error {
			task, _ := event.ParseTask(msg.Payload)
			next, err := event.New(event.RebaseRequested, issueOf(msg), task, msg)
			if err != nil {
				return err
			}
			if _, err := e.pub.PublishID(msg.Context(), rebase, next); err != nil {
				return err
			}
			_, err = results.Add(msg.Context(), event.RecordFor(msg, "triage", event.StageDone))
			return err
		})
		for i := range issues {
			e.publishTriage(fmt.Sprintf("RHEL-%d", i+1))
		}
		redistest.Eventually(b, time.Minute, func() bool { return e.rdb.XLen(ctx, e.topo.Results()).Val() == issues }, "all recorded")
		cancel()
	}
	// Weigh every key, by kind: the issue key and stream ids become placeholders.
	issueRE := regexp.MustCompile(`RHEL-\d+`)
	onceRE := regexp.MustCompile(`:once:.*$`)
	bytes, count := map[string]int64{}, map[string]int{}
	ttls := map[string]string{}
	var total int64
	for _, k := range e.rdb.Keys(context.Background(), "*").Val() {
		n := e.rdb.MemoryUsage(context.Background(), k, 0).Val()
		kind := onceRE.ReplaceAllString(issueRE.ReplaceAllString(strings.ReplaceAll(k, e.ns, ""), "KEY"), ":once:ID")
		bytes[kind] += n
		count[kind]++
		total += n
		if _, ok := ttls[kind]; !ok {
			ttl := e.rdb.PTTL(context.Background(), k).Val()
			ttls[kind] = "none"
			if ttl > 0 {
				ttls[kind] = ttl.Round(time.Second).String()
			}
		}
	}
	kinds := make([]string, 0, len(bytes))
	for k := range bytes {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	entries := e.rdb.XLen(context.Background(), e.triage()).Val() + e.rdb.XLen(context.Background(), rebase).Val() +
		e.rdb.XLen(context.Background(), e.topo.Results()).Val()
	for _, k := range kinds {
		b.Logf("FIGURE memory %-48s %5d keys  %8.1f B/issue  TTL %s", k, count[k], float64(bytes[k])/issues, ttls[k])
	}
	b.Logf("FIGURE memory all keys: %.0f B/issue; %d stream entries, %.0f B/entry in the streams", float64(total)/issues, entries,
		float64(bytes["ymir:triage"]+bytes["ymir:rebase:c9s"]+bytes["ymir:results"])/float64(entries))
	b.ReportMetric(float64(total)/issues, "B/issue")
}
