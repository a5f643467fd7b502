package ratelimit

import (
	"time"

	"github.com/ymirflow/ymirflow/internal/metric"
)

// Metrics are the Prometheus metrics of a Limiter. A nil *Metrics counts nothing.
type Metrics struct {
	permits *metric.Counter
	refused *metric.Counter
	waits   *metric.Histogram
	pauses  *metric.Counter
}

// NewMetrics makes the metrics on reg:
//
//	ymirflow_ratelimit_permits_total{limit}             events permitted
//	ymirflow_ratelimit_throttled_total{limit,reason}    refusals: reason rate (GCRA) or paused (a 429's pause)
//	ymirflow_ratelimit_wait_seconds{limit}              how long Wait waited, for the waits that waited
//	ymirflow_ratelimit_pauses_total{limit}              pauses set by Throttle (an upstream's 429)
func NewMetrics(reg *metric.Registry) *Metrics {
	return &Metrics{
		permits: reg.Counter("ymirflow_ratelimit_permits_total", "Events a shared rate limit permitted, by limit.", "limit"),
		refused: reg.Counter("ymirflow_ratelimit_throttled_total",
			"Requests a shared rate limit refused, by limit and reason (rate: over the budget; paused: an upstream's 429 paused it).",
			"limit", "reason"),
		waits: reg.Histogram("ymirflow_ratelimit_wait_seconds",
			"How long a caller waited for a shared rate limit's permit, for those that waited.",
			metric.ExponentialBuckets(0.001, 4, 12), "limit"),
		pauses: reg.Counter("ymirflow_ratelimit_pauses_total",
			"Pauses set for every process after an upstream answered 429, by limit.", "limit"),
	}
}

func (m *Metrics) permitted(name string) {
	if m != nil {
		m.permits.Inc(name)
	}
}

func (m *Metrics) throttled(name, reason string) {
	if m != nil {
		m.refused.Inc(name, reason)
	}
}

func (m *Metrics) waited(name string, d time.Duration) {
	if m != nil {
		m.waits.Observe(d.Seconds(), name)
	}
}

func (m *Metrics) paused(name string) {
	if m != nil {
		m.pauses.Inc(name)
	}
}

// Throttled is the count of refusals of limit for reason ("rate" or "paused"), for
// tests and dashboards' sanity checks.
func (m *Metrics) Throttled(limit, reason string) float64 { return m.refused.Value(limit, reason) }

// Waits is how many limits have a wait recorded (series of
// ymirflow_ratelimit_wait_seconds).
func (m *Metrics) Waits() int { return m.waits.Series() }
