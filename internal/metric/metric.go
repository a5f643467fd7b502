// Package metric is the process's Prometheus metrics: families of counters, gauges and
// histograms with labels, served in Prometheus's text format with each family's HELP
// and TYPE, then the Go runtime's and the process's own (go_*, process_*).
//
// The series live in a VictoriaMetrics/metrics Set. prometheus/client_golang did this
// job before; its package initialisation (a default registry holding the Go and process
// collectors, procfs, protobuf descriptors) ran before every command of the binary,
// ≈ 2.7 ms of a CLI command's start, though only the worker and the webhook serve
// /metrics. VictoriaMetrics/metrics does little at package initialisation.
//
// A family's name, help and labels are fixed when it is made; its series are made on
// first use, one per tuple of label values. Giving the wrong number of label values,
// or making two families of one name, is a programming error and panics, as
// client_golang's WithLabelValues and MustRegister do.
package metric

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

// Registry holds the families of one process (or of one test).
type Registry struct {
	set  *metrics.Set
	mu   sync.Mutex
	fams map[string]family
}

// family is what the exposition writes before a family's samples.
type family struct{ help, typ string }

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{set: metrics.NewSet(), fams: map[string]family{}}
}

// add records a family's HELP and TYPE; a name made twice panics.
func (r *Registry) add(name, help, typ string, labels []string) {
	if err := metrics.ValidateMetric(name); err != nil || strings.ContainsRune(name, '{') {
		panic(fmt.Sprintf("metric: invalid family name %q", name))
	}
	for _, l := range labels {
		if err := metrics.ValidateMetric(l); err != nil || l == "le" {
			panic(fmt.Sprintf("metric: %s: invalid label name %q", name, l))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.fams[name]; ok {
		panic(fmt.Sprintf("metric: family %s made twice", name))
	}
	// A histogram's samples are name_bucket, name_sum and name_count: no other family
	// may have those names, or the exposition could not tell the two apart.
	for _, suffix := range histogramSuffixes {
		if base, ok := strings.CutSuffix(name, suffix); ok && r.fams[base].typ == "histogram" {
			panic(fmt.Sprintf("metric: family %s collides with histogram %s", name, base))
		}
		if _, ok := r.fams[name+suffix]; ok && typ == "histogram" {
			panic(fmt.Sprintf("metric: histogram %s collides with family %s", name, name+suffix))
		}
	}
	r.fams[name] = family{help: help, typ: typ}
}

var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// series is one family's series by label values, made on first use.
type series[T any] struct {
	name   string
	labels []string
	create func(name string) T
	mu     sync.RWMutex
	byKey  map[string]T
}

func newSeries[T any](name string, labels []string, create func(string) T) *series[T] {
	return &series[T]{name: name, labels: labels, create: create, byKey: map[string]T{}}
}

// get returns the series of values, made if new. Most calls find it: they share the
// read lock.
func (s *series[T]) get(values []string) T {
	key := s.key(values)
	s.mu.RLock()
	m, ok := s.byKey[key]
	s.mu.RUnlock()
	if ok {
		return m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok = s.byKey[key]; !ok {
		m = s.create(s.fullName(values))
		s.byKey[key] = m
	}
	return m
}

// lookup returns the series of values if it was made.
func (s *series[T]) lookup(values []string) (T, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.byKey[s.key(values)]
	return m, ok
}

// drop forgets the series of values and returns its full name, or "" if none.
func (s *series[T]) drop(values []string) string {
	key := s.key(values)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byKey[key]; !ok {
		return ""
	}
	delete(s.byKey, key)
	return s.fullName(values)
}

func (s *series[T]) key(values []string) string {
	if len(values) != len(s.labels) {
		panic(fmt.Sprintf("metric: %s takes %d label values (%s), got %d", s.name, len(s.labels),
			strings.Join(s.labels, ", "), len(values)))
	}
	return strings.Join(values, "\xff")
}

// fullName is the series' name in the text format: name{label="value",...}, each
// value escaped as the format says (backslash, double quote, line feed).
func (s *series[T]) fullName(values []string) string {
	if len(values) == 0 {
		return s.name
	}
	var b strings.Builder
	b.WriteString(s.name)
	b.WriteByte('{')
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.labels[i])
		b.WriteString(`="`)
		b.WriteString(escaper.Replace(v))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

var escaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// Counter is a family of counters.
type Counter struct {
	s *series[*metrics.FloatCounter]
}

// Counter makes a family of counters (its name should end in _total).
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	r.add(name, help, "counter", labels)
	return &Counter{newSeries(name, labels, r.set.GetOrCreateFloatCounter)}
}

// Inc adds one to the series of values.
func (c *Counter) Inc(values ...string) { c.s.get(values).Add(1) }

// Add adds v to the series of values (made, at 0, if v is 0). A counter never goes
// down: a negative v is ignored.
func (c *Counter) Add(v float64, values ...string) {
	m := c.s.get(values)
	if v > 0 {
		m.Add(v)
	}
}

// Value is the series' count, 0 if it was never counted.
func (c *Counter) Value(values ...string) float64 {
	if m, ok := c.s.lookup(values); ok {
		return m.Get()
	}
	return 0
}

// Gauge is a family of gauges.
type Gauge struct {
	set *metrics.Set
	s   *series[*metrics.Gauge]
}

// Gauge makes a family of gauges.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	r.add(name, help, "gauge", labels)
	return &Gauge{set: r.set, s: newSeries(name, labels, func(n string) *metrics.Gauge { return r.set.GetOrCreateGauge(n, nil) })}
}

// Set sets the series of values.
func (g *Gauge) Set(v float64, values ...string) { g.s.get(values).Set(v) }

// Delete removes the series of values from the exposition.
func (g *Gauge) Delete(values ...string) {
	if name := g.s.drop(values); name != "" {
		g.set.UnregisterMetric(name)
	}
}

// Value is the series' value, 0 if it is not set.
func (g *Gauge) Value(values ...string) float64 {
	if m, ok := g.s.lookup(values); ok {
		return m.Get()
	}
	return 0
}

// Histogram is a family of histograms with fixed buckets (Prometheus's le).
type Histogram struct {
	s *series[*metrics.PrometheusHistogram]
}

// Histogram makes a family of histograms with the given upper bounds, ascending.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Histogram {
	r.add(name, help, "histogram", labels)
	return &Histogram{newSeries(name, labels, func(n string) *metrics.PrometheusHistogram {
		return r.set.GetOrCreatePrometheusHistogramExt(n, buckets)
	})}
}

// Observe adds v to the series of values.
func (h *Histogram) Observe(v float64, values ...string) { h.s.get(values).Update(v) }

// Series is how many series of the family have observed something.
func (h *Histogram) Series() int {
	h.s.mu.RLock()
	defer h.s.mu.RUnlock()
	return len(h.s.byKey)
}

// ExponentialBuckets is count upper bounds: start, start*factor, start*factor², ...
func ExponentialBuckets(start, factor float64, count int) []float64 {
	b := make([]float64, count)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

// WritePrometheus writes every family in Prometheus's text format (0.0.4), each
// preceded by its HELP and TYPE, then the go_* and process_* metrics.
func (r *Registry) WritePrometheus(w io.Writer) {
	var buf bytes.Buffer
	r.set.WritePrometheus(&buf)
	r.mu.Lock()
	defer r.mu.Unlock()
	fams := r.fams
	var out bytes.Buffer
	prev := ""
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if line == "" {
			continue
		}
		if name := familyOf(line, fams); name != prev {
			if f, ok := fams[name]; ok {
				out.WriteString("# HELP " + name + " " + helpEscaper.Replace(f.help) + "\n# TYPE " + name + " " + f.typ + "\n")
			}
			prev = name
		}
		out.WriteString(line)
	}
	metrics.WriteProcessMetrics(&out)
	_, _ = w.Write(out.Bytes())
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

// familyOf is the family a sample line belongs to: its name, or for a histogram's
// _bucket, _sum and _count samples, the histogram's.
func familyOf(line string, fams map[string]family) string {
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		return ""
	}
	name := line[:end]
	if _, ok := fams[name]; ok {
		return name
	}
	for _, suffix := range histogramSuffixes {
		if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].typ == "histogram" {
			return base
		}
	}
	return name
}

// Handler serves WritePrometheus.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var buf bytes.Buffer
		r.WritePrometheus(&buf)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		_, _ = w.Write(buf.Bytes())
	})
}
