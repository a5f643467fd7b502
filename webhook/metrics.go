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
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	processed *prometheus.CounterVec
	process   *prometheus.HistogramVec
}

// NewMetrics registers the receiver's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Subsystem: "webhook",
			Name: "deliveries_total",
			Help: "Webhook deliveries answered, by HTTP status and outcome (queued, duplicate, bad_signature_<why>, too_large, malformed, method_not_allowed, unsupported_media_type, redis_unavailable)."},
			[]string{"status", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ymirflow", Subsystem: "webhook",
			Name: "delivery_seconds", Help: "Time from a delivery's arrival to its answer.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"status"}),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Subsystem: "webhook",
			Name: "processed_total",
			Help: "Stored deliveries classified, by the status they would have been answered and outcome (published, skipped_<reason>, duplicate, own_account, out_of_scope, followup_published, comment_no_run, ignored_event, gone, redis_unavailable, jira_unavailable, timeout, error; gave_up after the last attempt)."},
			[]string{"status", "outcome"}),
		process: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ymirflow", Subsystem: "webhook",
			Name: "process_seconds", Help: "Time to classify one stored delivery (Jira calls under the client's rate limit included).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"status"}),
	}
	reg.MustRegister(m.requests, m.duration, m.processed, m.process)
	return m
}

func (m *Metrics) observeProcessed(status int, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	s := statusText(status)
	m.processed.WithLabelValues(s, outcome).Inc()
	if outcome != "gave_up" {
		m.process.WithLabelValues(s).Observe(took.Seconds())
	}
}

func (m *Metrics) observe(status int, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	s := statusText(status)
	m.requests.WithLabelValues(s, outcome).Inc()
	m.duration.WithLabelValues(s).Observe(took.Seconds())
}

// Count returns the deliveries counted with status and outcome, answered or classified
// (for tests and the benchmark).
func (m *Metrics) Count(status int, outcome string) float64 {
	var n float64
	for _, v := range []*prometheus.CounterVec{m.requests, m.processed} {
		if c, err := v.GetMetricWithLabelValues(statusText(status), outcome); err == nil {
			n += counterValue(c)
		}
	}
	return n
}

func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil || d.Counter == nil {
		return 0
	}
	return d.Counter.GetValue()
}

func statusText(status int) string { return strconv.Itoa(status) }
