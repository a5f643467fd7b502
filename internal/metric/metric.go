// Package metric is the process's Prometheus metrics: families of counters, gauges and
// histograms with labels, served in Prometheus's text format (0.0.4) with each family's
// HELP and TYPE, then the Go runtime's and the process's own (go_*, process_*:
// runtime.go).
//
// The series are this package's own, a few atomic words each. prometheus/client_golang
// did the job before: its package initialisation (a default registry holding the Go
// and process collectors, procfs, protobuf descriptors) ran before every command of the
// binary, though only the worker and the webhook serve /metrics: with the protobuf
// runtime it shared with OTLP's generated types (see internal/tracing's otlpencode.go),
// ≈ 4 ms of a CLI command's start. VictoriaMetrics/metrics, tried next, still read cgroup files and
// built runtime/metrics' tables at initialisation (≈ 0.3 ms of each start, ≈ 0.9 ms of
// initialisation by GODEBUG=inittrace=1) for what is here ≈ 100 lines. This package
// does nothing before a metric is made.
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
	"math"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Registry holds the families of one process (or of one test).
type Registry struct {
	mu    sync.Mutex
	fams  map[string]family
	start time.Time // process_start_time_seconds: when the process made its metrics
}

// family is one family as the exposition writes it: HELP, TYPE, then its samples.
type family struct {
	help, typ string
	samples   func(b *bytes.Buffer, name string)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{fams: map[string]family{}, start: time.Now()}
}

// metricName and labelName are the text format's names.
var (
	metricName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`) })
	labelName  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`) })
)

var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// add records a family; a name made twice, or taken by a histogram's samples, panics.
func (r *Registry) add(name, help, typ string, labels []string, samples func(*bytes.Buffer, string)) {
	if !metricName().MatchString(name) {
		panic(fmt.Sprintf("metric: invalid family name %q", name))
	}
	for _, l := range labels {
		if !labelName().MatchString(l) || l == "le" || strings.HasPrefix(l, "__") {
			panic(fmt.Sprintf("metric: %s: invalid label name %q", name, l))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.fams[name]; ok {
		panic(fmt.Sprintf("metric: family %s made twice", name))
	}
	// A histogram's samples are name_bucket, name_sum and name_count: no other family
	// may have those names, or a scraper could not tell the two apart.
	for _, suffix := range histogramSuffixes {
		if base, ok := strings.CutSuffix(name, suffix); ok && r.fams[base].typ == "histogram" {
			panic(fmt.Sprintf("metric: family %s collides with histogram %s", name, base))
		}
		if _, ok := r.fams[name+suffix]; ok && typ == "histogram" {
			panic(fmt.Sprintf("metric: histogram %s collides with family %s", name, name+suffix))
		}
	}
	r.fams[name] = family{help: help, typ: typ, samples: samples}
}

// series is one family's series by label values, made on first use.
type series[T any] struct {
	name   string
	labels []string
	create func() T
	mu     sync.RWMutex
	byKey  map[string]entry[T]
}

// entry is a series and its labels as the exposition writes them: a="x",b="y".
type entry[T any] struct {
	labels string
	m      T
}

func newSeries[T any](name string, labels []string, create func() T) *series[T] {
	return &series[T]{name: name, labels: labels, create: create, byKey: map[string]entry[T]{}}
}

// get returns the series of values, made if new. Most calls find it: they share the
// read lock.
func (s *series[T]) get(values []string) T {
	key := s.key(values)
	s.mu.RLock()
	e, ok := s.byKey[key]
	s.mu.RUnlock()
	if ok {
		return e.m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok = s.byKey[key]; !ok {
		e = entry[T]{labels: s.render(values), m: s.create()}
		s.byKey[key] = e
	}
	return e.m
}

// lookup returns the series of values if it was made.
func (s *series[T]) lookup(values []string) (T, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.byKey[s.key(values)]
	return e.m, ok
}

// drop forgets the series of values.
func (s *series[T]) drop(values []string) {
	key := s.key(values)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byKey, key)
}

// sorted is the family's series, ordered by their labels.
func (s *series[T]) sorted() []entry[T] {
	s.mu.RLock()
	out := make([]entry[T], 0, len(s.byKey))
	for _, e := range s.byKey {
		out = append(out, e)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b entry[T]) int { return strings.Compare(a.labels, b.labels) })
	return out
}

func (s *series[T]) key(values []string) string {
	if len(values) != len(s.labels) {
		panic(fmt.Sprintf("metric: %s takes %d label values (%s), got %d", s.name, len(s.labels),
			strings.Join(s.labels, ", "), len(values)))
	}
	return strings.Join(values, "\xff")
}

// render is the series' labels in the text format, each value escaped as the format
// says (backslash, double quote, line feed).
func (s *series[T]) render(values []string) string {
	var b strings.Builder
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.labels[i])
		b.WriteString(`="`)
		b.WriteString(escaper.Replace(v))
		b.WriteByte('"')
	}
	return b.String()
}

var escaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// float is a float64 read and written atomically.
type float struct{ bits atomic.Uint64 }

func (f *float) load() float64   { return math.Float64frombits(f.bits.Load()) }
func (f *float) store(v float64) { f.bits.Store(math.Float64bits(v)) }

func (f *float) add(v float64) {
	for {
		old := f.bits.Load()
		if f.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// sample writes one line: name{labels} value (name value without labels).
func sample(b *bytes.Buffer, name, labels string, v float64) {
	b.WriteString(name)
	if labels != "" {
		b.WriteByte('{')
		b.WriteString(labels)
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(formatFloat(v))
	b.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Counter is a family of counters.
type Counter struct{ s *series[*float] }

// Counter makes a family of counters (its name should end in _total).
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	c := &Counter{newSeries(name, labels, func() *float { return &float{} })}
	r.add(name, help, "counter", labels, c.samples)
	return c
}

// Inc adds one to the series of values.
func (c *Counter) Inc(values ...string) { c.s.get(values).add(1) }

// Add adds v to the series of values (made, at 0, if v is 0). A counter never goes
// down: a negative v is ignored.
func (c *Counter) Add(v float64, values ...string) {
	m := c.s.get(values)
	if v > 0 {
		m.add(v)
	}
}

// Value is the series' count, 0 if it was never counted.
func (c *Counter) Value(values ...string) float64 { return value(c.s, values) }

func (c *Counter) samples(b *bytes.Buffer, name string) { floatSamples(b, name, c.s) }

// Gauge is a family of gauges.
type Gauge struct{ s *series[*float] }

// Gauge makes a family of gauges.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	g := &Gauge{newSeries(name, labels, func() *float { return &float{} })}
	r.add(name, help, "gauge", labels, g.samples)
	return g
}

// Set sets the series of values.
func (g *Gauge) Set(v float64, values ...string) { g.s.get(values).store(v) }

// Delete removes the series of values from the exposition.
func (g *Gauge) Delete(values ...string) { g.s.drop(values) }

// Value is the series' value, 0 if it is not set.
func (g *Gauge) Value(values ...string) float64 { return value(g.s, values) }

func (g *Gauge) samples(b *bytes.Buffer, name string) { floatSamples(b, name, g.s) }

// value is a counter's or gauge's series of values, 0 if it was never made.
func value(s *series[*float], values []string) float64 {
	if m, ok := s.lookup(values); ok {
		return m.load()
	}
	return 0
}

// floatSamples writes a counter's or gauge's series, one line each.
func floatSamples(b *bytes.Buffer, name string, s *series[*float]) {
	for _, e := range s.sorted() {
		sample(b, name, e.labels, e.m.load())
	}
}

// Histogram is a family of histograms with fixed buckets (Prometheus's le).
type Histogram struct {
	bounds []float64
	les    []string // the bounds as le values, then "+Inf"
	s      *series[*hist]
}

// hist is one histogram: the observations per bucket (not cumulated; the last one is
// above every bound) and their sum.
type hist struct {
	counts []atomic.Uint64
	sum    float
}

// Histogram makes a family of histograms with the given upper bounds, ascending.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Histogram {
	if !slices.IsSorted(buckets) || len(buckets) == 0 {
		panic(fmt.Sprintf("metric: %s: buckets %v are not ascending", name, buckets))
	}
	h := &Histogram{bounds: slices.Clone(buckets)}
	for _, b := range buckets {
		h.les = append(h.les, formatFloat(b))
	}
	h.les = append(h.les, "+Inf")
	h.s = newSeries(name, labels, func() *hist { return &hist{counts: make([]atomic.Uint64, len(h.les))} })
	r.add(name, help, "histogram", labels, h.samples)
	return h
}

// Observe adds v to the series of values: to the first bucket whose bound is at least v.
func (h *Histogram) Observe(v float64, values ...string) {
	m := h.s.get(values)
	m.counts[sort.SearchFloat64s(h.bounds, v)].Add(1)
	m.sum.add(v)
}

// Series is how many series of the family have observed something.
func (h *Histogram) Series() int {
	h.s.mu.RLock()
	defer h.s.mu.RUnlock()
	return len(h.s.byKey)
}

// samples writes each series' cumulated buckets, its sum and its count (the +Inf
// bucket's, so that the two always agree).
func (h *Histogram) samples(b *bytes.Buffer, name string) {
	for _, e := range h.s.sorted() {
		sep := ""
		if e.labels != "" {
			sep = ","
		}
		var n uint64
		for i, le := range h.les {
			n += e.m.counts[i].Load()
			sample(b, name+"_bucket", e.labels+sep+`le="`+le+`"`, float64(n))
		}
		sample(b, name+"_sum", e.labels, e.m.sum.load())
		sample(b, name+"_count", e.labels, float64(n))
	}
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

// WritePrometheus writes every family with a series, by name, each preceded by its
// HELP and TYPE, then the go_* and process_* metrics.
func (r *Registry) WritePrometheus(w io.Writer) {
	r.mu.Lock()
	names := make([]string, 0, len(r.fams))
	for name := range r.fams {
		names = append(names, name)
	}
	fams := make([]family, 0, len(names))
	slices.Sort(names)
	for _, name := range names {
		fams = append(fams, r.fams[name])
	}
	r.mu.Unlock()
	var out, samples bytes.Buffer
	for i, f := range fams {
		samples.Reset()
		f.samples(&samples, names[i])
		if samples.Len() == 0 {
			continue
		}
		out.WriteString("# HELP " + names[i] + " " + helpEscaper.Replace(f.help) + "\n# TYPE " + names[i] + " " + f.typ + "\n")
		out.Write(samples.Bytes())
	}
	r.writeRuntime(&out)
	_, _ = w.Write(out.Bytes())
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

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
