package metric_test

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/ymirflow/ymirflow/internal/metric"
)

// What /metrics serves is read by Prometheus's own text parser (prometheus/common, the
// one its server uses): every family typed, every value where it was put, a label
// value with quotes, backslashes and line feeds given back as it was.
func TestExpositionIsWhatPrometheusReads(t *testing.T) {
	r := metric.NewRegistry()
	c := r.Counter("x_total", "Events, \\ and\nmore.", "agent", "model")
	g := r.Gauge("x_waiting", "Waiting.", "key")
	h := r.Histogram("x_seconds", "How long.", []float64{0.5, 1}, "agent")
	plain := r.Counter("x_plain_total", "No labels.")
	c.Add(2.5, "triage", "a\"b\\c\nd")
	g.Set(-3, "k")
	for _, v := range []float64{0.1, 0.5, 0.7, 9} {
		h.Observe(v, "triage")
	}
	plain.Inc()
	var parser expfmt.TextParser
	fams, err := parser.TextToMetricFamilies(strings.NewReader(scrape(t, r)))
	if err != nil {
		t.Fatalf("Prometheus cannot read it: %v", err)
	}
	want := map[string]dto.MetricType{"x_total": dto.MetricType_COUNTER, "x_waiting": dto.MetricType_GAUGE,
		"x_seconds": dto.MetricType_HISTOGRAM, "x_plain_total": dto.MetricType_COUNTER,
		"go_goroutines": dto.MetricType_GAUGE, "process_cpu_seconds_total": dto.MetricType_COUNTER}
	for name, typ := range want {
		if f := fams[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want a %v", name, f, typ)
		}
	}
	if f := fams["x_total"]; f.GetHelp() != "Events, \\ and\nmore." || f.GetMetric()[0].GetCounter().GetValue() != 2.5 ||
		f.GetMetric()[0].GetLabel()[1].GetValue() != "a\"b\\c\nd" {
		t.Errorf("x_total read as %v", f)
	}
	if v := fams["x_waiting"].GetMetric()[0].GetGauge().GetValue(); v != -3 {
		t.Errorf("x_waiting %v", v)
	}
	hist := fams["x_seconds"].GetMetric()[0].GetHistogram()
	var cum []uint64
	for _, b := range hist.GetBucket() {
		cum = append(cum, b.GetCumulativeCount())
	}
	if hist.GetSampleCount() != 4 || hist.GetSampleSum() != 10.3 || len(cum) != 3 || cum[0] != 2 || cum[1] != 3 || cum[2] != 4 {
		t.Errorf("x_seconds read as count %d sum %v buckets %v", hist.GetSampleCount(), hist.GetSampleSum(), cum)
	}
}
