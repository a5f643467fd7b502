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

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
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

// rateLimitSamples is the number of isolated changes, and of back-to-back runs, measured
// per limiter setting and payload shape.
const rateLimitSamples = 15

// backToBack is the length of a back-to-back run: each change is made the moment the
// previous one's entry appears (a maintainer labelling a few issues in a row). A change
// costs two Jira calls (the scope search before its publish, the label flip after), so
// three in a row fit the default burst of 5; from the fourth on, changes are paced by
// the rate limit (400 ms apart at 5/s).
const backToBack = 3

// BenchmarkTodoRateLimit measures, in one run, the time from a maintainer adding ymir_todo
// in the fake Jira to its entry in ymir:triage:todo with the Jira client's default rate
// limit (JIRA_RATE_LIMIT 5/s, its default burst) and with no limit: for an isolated change
// (the receiver idle for a second before it) and for the later changes of back-to-back
// runs of 3 (backToBack, idle before each run); with a payload that carries every field the rules read ("full") and one
// without the component field ("thin"). The maintainer's first change is made before
// measuring (its group read). Loopback, real Redis.
//
//	go test -run XXX -bench TodoRateLimit -benchtime 1x -v ./webhook/
func BenchmarkTodoRateLimit(b *testing.B) {
	for range b.N {
		p99 := map[string]time.Duration{}
		for _, shape := range []string{"full", "thin"} {
			for _, lim := range []struct {
				name string
				rate float64
			}{{"default", 0}, {"off", -1}} {
				iso, run := todoLatencies(b, lim.rate, shape == "full")
				for what, d := range map[string][]time.Duration{"isolated": iso, "back-to-back": run} {
					name := shape + "-" + lim.name + "-" + what
					p99[name] = percentile(d, 0.99)
					b.ReportMetric(float64(percentile(d, 0.50).Microseconds())/1000, name+"-p50-ms")
					b.ReportMetric(float64(p99[name].Microseconds())/1000, name+"-p99-ms")
					b.Logf("FIGURE ymir_todo→ymir:triage:todo, %s payload, Jira rate limit %s, %s: p50 %s p99 %s over %d changes",
						shape, lim.name, what, percentile(d, 0.50).Round(10*time.Microsecond), p99[name].Round(10*time.Microsecond), len(d))
				}
			}
			for _, what := range []string{"isolated", "back-to-back"} {
				on, off := p99[shape+"-default-"+what], p99[shape+"-off-"+what]
				b.ReportMetric(float64(on)/float64(off), shape+"-"+what+"-p99-default/off")
			}
		}
		load, _ := os.ReadFile("/proc/loadavg")
		b.Logf("loadavg %s", strings.Join(strings.Fields(string(load))[:3], " "))
	}
}

// todoLatencies measures isolated changes and back-to-back runs on a receiver whose Jira
// client has rate (0: the default; negative: none), on issues whose payloads carry the
// component field (full) or not.
func todoLatencies(b *testing.B, rate float64, full bool) (isolated, run []time.Duration) {
	n := 1 + rateLimitSamples*(1+backToBack)
	var issues []fakejira.Issue
	for i := range n {
		is := issue("RHEL-"+strconv.Itoa(3000+i), "ymir_triaged_rebase")
		if full {
			is.Fields = map[string]any{"customfield_10669": nil}
		}
		issues = append(issues, is)
	}
	e := newEnv(b, issues, withJira(func(o *jira.Options) { o.RateLimit = rate }),
		withConfig(func(c *Config) { c.Deadline = DefaultDeadline }))
	// Pacing: long enough for the default bucket to be full again (a second for its 5
	// calls; a run spends 6, the last flip waiting its turn).
	idle, idleRun := time.Second, 1500*time.Millisecond
	if rate < 0 {
		idle, idleRun = 0, 0
	}
	stream := e.topo.Stream("triage", "", true)
	last, next := "0", 0
	change := func() time.Duration {
		key := "RHEL-" + strconv.Itoa(3000+next)
		next++
		start := time.Now()
		e.jira.ChangeLabels(key, maintainer, []string{labels.Todo}, nil)
		res, err := e.rdb.XRead(e.ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: 1, Block: 30 * time.Second}).Result()
		if err != nil {
			b.Fatalf("%s: no entry: %v\n%s", key, err, e.logs)
		}
		last = res[0].Messages[0].ID
		return time.Since(start)
	}
	change() // the maintainer's first: its group read
	for range rateLimitSamples {
		time.Sleep(idle) // pacing: the receiver idle before the change
		isolated = append(isolated, change())
	}
	for range rateLimitSamples {
		time.Sleep(idleRun)
		for i := range backToBack {
			if d := change(); i > 0 {
				run = append(run, d)
			}
		}
	}
	return isolated, run
}
