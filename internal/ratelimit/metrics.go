package ratelimit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus metrics of a Limiter. A nil *Metrics counts nothing.
type Metrics struct {
	permits *prometheus.CounterVec
	refused *prometheus.CounterVec
	waits   *prometheus.HistogramVec
	pauses  *prometheus.CounterVec
}

// NewMetrics builds the metrics and registers them on reg, unless reg is nil (a
// *Metrics is a prometheus.Collector, to register later):
//
//	ymirflow_ratelimit_permits_total{limit}             events permitted
//	ymirflow_ratelimit_throttled_total{limit,reason}    refusals: reason rate (GCRA) or paused (a 429's pause)
//	ymirflow_ratelimit_wait_seconds{limit}              how long Wait waited, for the waits that waited
//	ymirflow_ratelimit_pauses_total{limit}              pauses set by Throttle (an upstream's 429)
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		permits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "ratelimit_permits_total",
			Help: "Events a shared rate limit permitted, by limit."}, []string{"limit"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "ratelimit_throttled_total",
			Help: "Requests a shared rate limit refused, by limit and reason (rate: over the budget; paused: an upstream's 429 paused it)."},
			[]string{"limit", "reason"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ymirflow", Name: "ratelimit_wait_seconds",
			Help: "How long a caller waited for a shared rate limit's permit, for those that waited.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 12)},
			[]string{"limit"}),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "ratelimit_pauses_total",
			Help: "Pauses set for every process after an upstream answered 429, by limit."}, []string{"limit"}),
	}
	if reg != nil {
		reg.MustRegister(m)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.permits.Describe(ch)
	m.refused.Describe(ch)
	m.waits.Describe(ch)
	m.pauses.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.permits.Collect(ch)
	m.refused.Collect(ch)
	m.waits.Collect(ch)
	m.pauses.Collect(ch)
}

func (m *Metrics) permitted(name string) {
	if m != nil {
		m.permits.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) throttled(name, reason string) {
	if m != nil {
		m.refused.WithLabelValues(name, reason).Inc()
	}
}

func (m *Metrics) waited(name string, d time.Duration) {
	if m != nil {
		m.waits.WithLabelValues(name).Observe(d.Seconds())
	}
}

func (m *Metrics) paused(name string) {
	if m != nil {
		m.pauses.WithLabelValues(name).Inc()
	}
}

// Throttled is the counter of refusals of limit for reason ("rate" or "paused"), for
// tests and dashboards' sanity checks.
func (m *Metrics) Throttled(limit, reason string) prometheus.Counter {
	return m.refused.WithLabelValues(limit, reason)
}
