package webhook

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics counts deliveries by outcome. Register it on the process's registry (the one
// METRICS_ADDR serves) with NewMetrics.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers the receiver's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Subsystem: "webhook",
			Name: "deliveries_total",
			Help: "Webhook deliveries by HTTP status and outcome (published, skipped_<reason>, duplicate, own_account, out_of_scope, comment_recorded, ignored_event, bad_signature_<why>, too_large, malformed, method_not_allowed, unsupported_media_type, redis_unavailable, jira_unavailable, error)."},
			[]string{"status", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ymirflow", Subsystem: "webhook",
			Name: "delivery_seconds", Help: "Time from a delivery's arrival to its answer.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"status"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *Metrics) observe(status int, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	s := statusText(status)
	m.requests.WithLabelValues(s, outcome).Inc()
	m.duration.WithLabelValues(s).Observe(took.Seconds())
}

// Count returns the deliveries counted with status and outcome (for tests and the
// benchmark).
func (m *Metrics) Count(status int, outcome string) float64 {
	c, err := m.requests.GetMetricWithLabelValues(statusText(status), outcome)
	if err != nil {
		return 0
	}
	return counterValue(c)
}

func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil || d.Counter == nil {
		return 0
	}
	return d.Counter.GetValue()
}

func statusText(status int) string { return strconv.Itoa(status) }
