package metric_test

import (
	"bytes"
	"io"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ymirflow/ymirflow/internal/metric"
)

func scrape(t *testing.T, r *metric.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	return rec.Body.String()
}

// Every family is written once, HELP and TYPE first, its samples together, whatever
// the names around it (a histogram's _bucket/_sum/_count belong to it).
func TestExpositionHasEachFamilyOnceWithItsHelpAndType(t *testing.T) {
	r := metric.NewRegistry()
	c := r.Counter("x_events_total", "Events.", "agent")
	g := r.Gauge("x_events", "Events waiting.", "agent")
	h := r.Histogram("x_events_seconds", "How long.\nTwo lines.", []float64{0.1, 1}, "agent")
	c.Inc("b")
	c.Add(2, "a")
	g.Set(7, "a")
	h.Observe(0.5, "a")
	h.Observe(5, "a")
	out := scrape(t, r)
	want := []string{
		"# HELP x_events Events waiting.\n# TYPE x_events gauge\nx_events{agent=\"a\"} 7\n",
		"# HELP x_events_seconds How long.\\nTwo lines.\n# TYPE x_events_seconds histogram\n" +
			"x_events_seconds_bucket{agent=\"a\",le=\"0.1\"} 0\nx_events_seconds_bucket{agent=\"a\",le=\"1\"} 1\n" +
			"x_events_seconds_bucket{agent=\"a\",le=\"+Inf\"} 2\nx_events_seconds_sum{agent=\"a\"} 5.5\n" +
			"x_events_seconds_count{agent=\"a\"} 2\n",
		"# HELP x_events_total Events.\n# TYPE x_events_total counter\nx_events_total{agent=\"a\"} 2\nx_events_total{agent=\"b\"} 1\n",
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("exposition lacks\n%s\ngot:\n%s", w, out)
		}
	}
	for _, fam := range []string{"x_events", "x_events_seconds", "x_events_total"} {
		if n := strings.Count(out, "# TYPE "+fam+" "); n != 1 {
			t.Errorf("%s has %d TYPE lines", fam, n)
		}
	}
	for _, m := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if !strings.Contains(out, "\n"+m+" ") {
			t.Errorf("exposition lacks the runtime's %s", m)
		}
	}
	if c.Value("a") != 2 || c.Value("b") != 1 || c.Value("c") != 0 || g.Value("a") != 7 || h.Series() != 1 {
		t.Errorf("values: %v %v %v %v %v", c.Value("a"), c.Value("b"), c.Value("c"), g.Value("a"), h.Series())
	}
}

// A label value is text from outside (an agent's model, a limit's key): quotes,
// backslashes and line feeds are escaped, never break the line.
func TestLabelValuesAreEscaped(t *testing.T) {
	r := metric.NewRegistry()
	c := r.Counter("x_total", "X.", "model")
	c.Inc("a\"b\\c\nd")
	out := scrape(t, r)
	if !strings.Contains(out, `x_total{model="a\"b\\c\nd"} 1`+"\n") {
		t.Fatalf("escaped series missing:\n%s", out)
	}
}

func TestDeletedGaugeLeavesTheExposition(t *testing.T) {
	r := metric.NewRegistry()
	g := r.Gauge("x_slots", "Slots.", "key")
	g.Set(1, "k1")
	g.Set(2, "k2")
	g.Delete("k1")
	g.Delete("never")
	out := scrape(t, r)
	if strings.Contains(out, `key="k1"`) || !strings.Contains(out, `x_slots{key="k2"} 2`) {
		t.Fatalf("after Delete:\n%s", out)
	}
	g.Set(3, "k1")
	if !strings.Contains(scrape(t, r), `x_slots{key="k1"} 3`) {
		t.Fatal("a deleted series set again is not back")
	}
}

func TestProgrammingErrorsPanic(t *testing.T) {
	for name, f := range map[string]func(r *metric.Registry){
		"made twice":            func(r *metric.Registry) { r.Counter("x_total", "X."); r.Gauge("x_total", "X.") },
		"bad name":              func(r *metric.Registry) { r.Counter("x-total", "X.") },
		"bad label":             func(r *metric.Registry) { r.Counter("x_total", "X.", "a b") },
		"le on a family":        func(r *metric.Registry) { r.Histogram("x_seconds", "X.", []float64{1}, "le") },
		"wrong label arity":     func(r *metric.Registry) { r.Counter("x_total", "X.", "a").Inc() },
		"wrong arity, gauge":    func(r *metric.Registry) { r.Gauge("x", "X.").Set(1, "extra") },
		"labels in the name":    func(r *metric.Registry) { r.Counter(`x_total{a="b"}`, "X.") },
		"wrong arity, Delete":   func(r *metric.Registry) { r.Gauge("x", "X.", "a").Delete() },
		"buckets not ascending": func(r *metric.Registry) { r.Histogram("x_seconds", "X.", []float64{1, 0.5}) },
		"no buckets":            func(r *metric.Registry) { r.Histogram("x_seconds", "X.", nil) },
		"a histogram's sample name": func(r *metric.Registry) {
			r.Histogram("x_seconds", "X.", []float64{1})
			r.Counter("x_seconds_count", "X.")
		},
		"a histogram over a family's name": func(r *metric.Registry) {
			r.Gauge("x_seconds_sum", "X.")
			r.Histogram("x_seconds", "X.", []float64{1})
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f(metric.NewRegistry())
		})
	}
}

func TestExponentialBuckets(t *testing.T) {
	got := metric.ExponentialBuckets(0.001, 4, 3)
	if len(got) != 3 || got[0] != 0.001 || got[1] != 0.004 || got[2] != 0.016 {
		t.Fatalf("%v", got)
	}
}

// A histogram's series are the label tuples observed.
func ExampleRegistry() {
	r := metric.NewRegistry()
	held := r.Histogram("ymirflow_lease_hold_seconds", "How long leases were held.", []float64{1, 10}, "agent")
	held.Observe(2.5, "triage")
	var buf bytes.Buffer
	r.WritePrometheus(&buf)
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if strings.Contains(line, "ymirflow_") {
			_, _ = io.WriteString(os.Stdout, line)
		}
	}
	// Output:
	// # HELP ymirflow_lease_hold_seconds How long leases were held.
	// # TYPE ymirflow_lease_hold_seconds histogram
	// ymirflow_lease_hold_seconds_bucket{agent="triage",le="1"} 0
	// ymirflow_lease_hold_seconds_bucket{agent="triage",le="10"} 1
	// ymirflow_lease_hold_seconds_bucket{agent="triage",le="+Inf"} 1
	// ymirflow_lease_hold_seconds_sum{agent="triage"} 2.5
	// ymirflow_lease_hold_seconds_count{agent="triage"} 1
}

// Many goroutines counting into the same and new series while the exposition is
// written: no count is lost (run under -race).
func TestConcurrentCountsAreAllKept(t *testing.T) {
	r := metric.NewRegistry()
	c := r.Counter("x_total", "X.", "agent")
	h := r.Histogram("x_seconds", "X.", []float64{1}, "agent")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				c.Inc("shared")
				c.Inc("a" + strconv.Itoa(g))
				h.Observe(float64(i%2), "shared")
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			r.WritePrometheus(io.Discard)
		}
	})
	wg.Wait()
	if c.Value("shared") != 4000 || c.Value("a3") != 500 || h.Series() != 1 {
		t.Fatalf("shared %v, a3 %v, series %d", c.Value("shared"), c.Value("a3"), h.Series())
	}
	if out := scrape(t, r); !strings.Contains(out, `x_seconds_count{agent="shared"} 4000`) {
		t.Fatalf("histogram count lost:\n%s", out)
	}
}
