package webhook

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/pipeline/event"
)

// latencyChanges is the number of label changes measured per path.
const latencyChanges = 200

// latencySweepInterval is the sweep loop's interval in the comparison: the todo CronJob
// sweeps every few minutes; the delay of a sweep scales with its interval.
const latencySweepInterval = time.Second

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func latencyIssues() []fakejira.Issue {
	var out []fakejira.Issue
	for i := range latencyChanges {
		out = append(out, issue("RHEL-"+strconv.Itoa(1000+i), "ymir_triaged_rebase"))
	}
	return out
}

// BenchmarkLabelToStream measures, in one run, the time from a maintainer adding ymir_todo
// in the fake Jira to the triage request's entry in ymir:triage:todo: through the webhook
// (200 changes one after another, each waited for), and through sweeps every
// latencySweepInterval (200 changes spread over 4 s, no webhook). Loopback, real Redis,
// Jira rate limit off.
//
//	go test -run XXX -bench LabelToStream -benchtime 1x ./webhook/
func BenchmarkLabelToStream(b *testing.B) {
	for range b.N {
		hook := webhookLatencies(b)
		sweep := sweepLatencies(b)
		hp50, hp99 := percentile(hook, 0.50), percentile(hook, 0.99)
		sp50, sp99 := percentile(sweep, 0.50), percentile(sweep, 0.99)
		b.ReportMetric(float64(hp50.Microseconds())/1000, "webhook-p50-ms")
		b.ReportMetric(float64(hp99.Microseconds())/1000, "webhook-p99-ms")
		b.ReportMetric(float64(sp50.Microseconds())/1000, "sweep-p50-ms")
		b.ReportMetric(float64(sp99.Microseconds())/1000, "sweep-p99-ms")
		b.ReportMetric(float64(sp50)/float64(hp50), "sweep/webhook-p50")
		load, _ := os.ReadFile("/proc/loadavg") // outliers follow the machine's load
		b.Logf("FIGURE label→ymir:triage:todo over %d changes: webhook p50 %s p99 %s; sweep every %s p50 %s p99 %s (loadavg %s)",
			latencyChanges, hp50.Round(10*time.Microsecond), hp99.Round(10*time.Microsecond), latencySweepInterval,
			sp50.Round(time.Millisecond), sp99.Round(time.Millisecond), strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " "))
	}
}

// webhookLatencies adds ymir_todo to each issue in turn and waits for its entry.
func webhookLatencies(b *testing.B) []time.Duration {
	e := newEnv(b, latencyIssues(), withConfig(func(c *Config) { c.Deadline = DefaultDeadline }))
	stream := e.topo.Stream("triage", "", true)
	last := "0"
	var out []time.Duration
	for i := range latencyChanges {
		key := "RHEL-" + strconv.Itoa(1000+i)
		start := time.Now()
		e.jira.ChangeLabels(key, maintainer, []string{labels.Todo}, nil)
		res, err := e.rdb.XRead(e.ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: 1, Block: 10 * time.Second}).Result()
		if err != nil {
			b.Fatalf("%s: no entry: %v\n%s", key, err, e.logs)
		}
		out = append(out, time.Since(start))
		last = res[0].Messages[0].ID
	}
	e.waitDeliveries()
	if n := e.rdb.XLen(e.ctx, stream).Val(); n != latencyChanges {
		b.Fatalf("%d entries for %d changes", n, latencyChanges)
	}
	return out
}

// sweepLatencies spreads the changes over 4 s while a loop sweeps every
// latencySweepInterval; an issue's delay is its entry's time minus its change's.
func sweepLatencies(b *testing.B) []time.Duration {
	e := newEnv(b, latencyIssues(), withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(latencySweepInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := e.fetcher.Sweep(ctx); err != nil && ctx.Err() == nil {
					b.Errorf("sweep: %v", err)
				}
			}
		}
	}()
	changed := map[string]time.Time{}
	spacing := 4 * time.Second / latencyChanges
	for i := range latencyChanges {
		key := "RHEL-" + strconv.Itoa(1000+i)
		changed[key] = time.Now()
		e.jira.ChangeLabels(key, maintainer, []string{labels.Todo}, nil)
		time.Sleep(spacing) // pacing: the changes arrive spread over 4s, as maintainers' would
	}
	stream := e.topo.Stream("triage", "", true)
	eventually(b, 30*time.Second, "every change swept", func() bool {
		return e.rdb.XLen(e.ctx, stream).Val() >= latencyChanges
	})
	cancel()
	<-done
	xs, err := e.rdb.XRange(e.ctx, stream, "-", "+").Result()
	if err != nil || len(xs) != latencyChanges {
		b.Fatalf("%d entries (%v)", len(xs), err)
	}
	var out []time.Duration
	for _, x := range xs {
		key := event.EntryIssue(stream, x.ID, x.Values)
		msPart, _, _ := strings.Cut(x.ID, "-")
		ms, err := strconv.ParseInt(msPart, 10, 64)
		if err != nil || changed[key].IsZero() {
			b.Fatalf("entry %s %v: %v", x.ID, x.Values, err)
		}
		out = append(out, time.UnixMilli(ms).Sub(changed[key]))
	}
	return out
}
