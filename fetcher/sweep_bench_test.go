package fetcher

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// BenchmarkSweep10000Issues: one sweep of 10 000 issues that all need triage (no ymir
// label), against the fake Jira on loopback and the shared Redis, then a second sweep
// that finds them all queued already. It reports what each sweep costs: Jira requests
// by kind, Redis round trips (commands outside a pipeline count one each, a pipeline
// one), and wall time. Run it with -benchtime 1x: each iteration is a fresh namespace.
//
//	go test -run '^$' -bench Sweep10000Issues -benchtime 1x -v ./fetcher/ | grep FIGURE
func BenchmarkSweep10000Issues(b *testing.B) {
	const n = 10_000
	for b.Loop() {
		now := time.Now().UTC()
		issues := make([]fakejira.Issue, n)
		for i := range issues {
			k := fmt.Sprintf("RHEL-%d", i+1)
			issues[i] = fakejira.Issue{Key: k, Summary: "issue " + k, Status: "New", Updated: now, Created: now}
		}
		h := newHarness(b, issues)
		var rt redistest.RoundTrips
		h.rdb.(*redis.Client).AddHook(&rt)
		for sweep := 1; sweep <= 2; sweep++ {
			h.mu.Lock()
			h.bodies = nil
			h.mu.Unlock()
			rt.Reset()
			start := time.Now()
			sum := h.sweep()
			took := time.Since(start)
			searches := len(h.requests("", "/search"))
			puts := len(h.requests(http.MethodPut, "/issue/"))
			all := len(h.requests("", ""))
			b.Logf("FIGURE sweep %d of %d issues: %s (%.0f issues/s); %d published, %d label writes; Jira: %d requests "+
				"(%d search pages, %d label PUTs, %d other); Redis: %d round trips (%.3f per issue)",
				sweep, n, took.Round(time.Millisecond), float64(n)/took.Seconds(), sum.Published, sum.LabelWrites,
				all, searches, puts, all-searches-puts, rt.Count(), float64(rt.Count())/n)
			if sweep == 1 && sum.Published != n || sweep == 2 && sum.Published != 0 {
				b.Fatalf("sweep %d published %d", sweep, sum.Published)
			}
		}
	}
}
