package webhook

import (
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/internal/metric"
)

// Metrics counts deliveries by outcome. Make it on the process's registry (the one
// METRICS_ADDR serves) with NewMetrics.
type Metrics struct {
	requests  *metric.Counter
	duration  *metric.Histogram
	processed *metric.Counter
	process   *metric.Histogram
}

// NewMetrics makes the receiver's metrics on reg.
func NewMetrics(reg *metric.Registry) *Metrics {
	return &Metrics{
		requests: reg.Counter("ymirflow_webhook_deliveries_total",
			"Webhook deliveries answered, by HTTP status and outcome (queued, duplicate, bad_signature_<why>, too_large, malformed, method_not_allowed, unsupported_media_type, redis_unavailable).",
			"status", "outcome"),
		duration: reg.Histogram("ymirflow_webhook_delivery_seconds", "Time from a delivery's arrival to its answer.",
			metric.ExponentialBuckets(0.0005, 2, 14), "status"),
		processed: reg.Counter("ymirflow_webhook_processed_total",
			"Stored deliveries classified, by the status they would have been answered and outcome (published, skipped_<reason>, duplicate, own_account, out_of_scope, followup_published, comment_no_run, ignored_event, gone, redis_unavailable, jira_unavailable, timeout, error; gave_up after the last attempt).",
			"status", "outcome"),
		process: reg.Histogram("ymirflow_webhook_process_seconds",
			"Time to classify one stored delivery (Jira calls under the client's rate limit included).",
			metric.ExponentialBuckets(0.001, 2, 15), "status"),
	}
}

func (m *Metrics) observeProcessed(status int, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	s := statusText(status)
	m.processed.Inc(s, outcome)
	if outcome != "gave_up" {
		m.process.Observe(took.Seconds(), s)
	}
}

func (m *Metrics) observe(status int, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	s := statusText(status)
	m.requests.Inc(s, outcome)
	m.duration.Observe(took.Seconds(), s)
}

// Count returns the deliveries counted with status and outcome, answered or classified
// (for tests and the benchmark).
func (m *Metrics) Count(status int, outcome string) float64 {
	return m.requests.Value(statusText(status), outcome) + m.processed.Value(statusText(status), outcome)
}

func statusText(status int) string { return strconv.Itoa(status) }
