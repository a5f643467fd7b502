package webhook

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// burstDeliveries is the size of the burst: a maintainer labelling a batch of issues.
const burstDeliveries = 50

// BenchmarkWebhookBurst sends a burst of 50 signed deliveries at once (each a maintainer's
// ymir_todo on its own issue) to a receiver with default settings: the Jira client's
// defaults (JIRA_RATE_LIMIT=5, retries, timeouts), WEBHOOK_DEADLINE 900 ms, the default
// classification settings. It reports the time to each delivery's answer (what Jira waits
// for: p50, p99, max) and, separately, the time from the burst to each request in
// ymir:triage:todo (the classification, paced by the rate limit after its burst: two
// Jira calls per delivery here, the scope search and the label flip, and one group read
// for the maintainer). Loopback, real Redis.
//
//	go test -run XXX -bench WebhookBurst -benchtime 1x -v ./webhook/
func BenchmarkWebhookBurst(b *testing.B) {
	for range b.N {
		var issues []fakejira.Issue
		for i := range burstDeliveries {
			issues = append(issues, issue("RHEL-"+strconv.Itoa(2000+i), "ymir_triaged_rebase"))
		}
		e := newEnv(b, issues, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }),
			withJira(func(o *jira.Options) { *o = jira.Options{BaseURL: o.BaseURL, Token: o.Token} }), // every default
			withConfig(func(c *Config) { c.Deadline = 0 }))                                            // the default
		bodies := make([][]byte, burstDeliveries)
		for i := range burstDeliveries {
			key := "RHEL-" + strconv.Itoa(2000+i)
			e.jira.ChangeLabels(key, maintainer, []string{labels.Todo}, nil)
			bodies[i] = e.event(key, maintainer, labels.Todo)
		}
		// The payloads were read through the rate-limited client: wait for its bucket to
		// refill, so the burst starts as it would in production.
		time.Sleep(time.Second)

		answers := make([]time.Duration, burstDeliveries)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range burstDeliveries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				st, ans := e.postRaw(bodies[i], signed(bodies[i], "burst-"+strconv.Itoa(i)))
				answers[i] = time.Since(t0)
				if st != http.StatusAccepted || ans["outcome"] != "queued" {
					b.Errorf("delivery %d: %d %v", i, st, ans)
				}
			}()
		}
		wg.Wait()
		answered := time.Since(start)
		e.drain(5 * time.Minute) // paced by JIRA_RATE_LIMIT
		classifiedAll := time.Since(start)
		if got := e.entries(); len(got) != burstDeliveries {
			b.Fatalf("%d entries for %d deliveries\n%s", len(got), burstDeliveries, e.logs)
		}
		p50, p99, worst := percentile(answers, 0.50), percentile(answers, 0.99), percentile(answers, 1)
		b.ReportMetric(float64(p50.Microseconds())/1000, "answer-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "answer-p99-ms")
		b.ReportMetric(float64(worst.Microseconds())/1000, "answer-max-ms")
		b.ReportMetric(classifiedAll.Seconds(), "all-in-stream-s")
		load, _ := os.ReadFile("/proc/loadavg")
		b.Logf("FIGURE burst of %d deliveries, default settings (JIRA_RATE_LIMIT=%g): answers p50 %s p99 %s max %s (all answered in %s); all %d requests in ymir:triage:todo after %s (loadavg %s)",
			burstDeliveries, jira.DefaultRateLimit, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond),
			worst.Round(10*time.Microsecond), answered.Round(time.Millisecond), burstDeliveries,
			classifiedAll.Round(time.Millisecond), strings.Join(strings.Fields(string(load))[:3], " "))
		if p99 >= 200*time.Millisecond {
			b.Errorf("answer p99 %s, want below 200ms", p99)
		}
	}
}
