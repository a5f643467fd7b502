package metric_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ymirflow/ymirflow/internal/metric"
)

// The per-event metrics (a lease taken, a handler timed) beside Prometheus's client,
// which they replace, in one run:
//
//	go test -run '^$' -bench . -count 5 ./internal/metric/
func BenchmarkCounterInc(b *testing.B) {
	b.Run("ours", func(b *testing.B) {
		c := metric.NewRegistry().Counter("x_total", "X.", "agent")
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Inc("triage")
			}
		})
	})
	b.Run("client_golang", func(b *testing.B) {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "X."}, []string{"agent"})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.WithLabelValues("triage").Inc()
			}
		})
	})
}

func BenchmarkHistogramObserve(b *testing.B) {
	buckets := metric.ExponentialBuckets(0.001, 4, 12)
	b.Run("ours", func(b *testing.B) {
		h := metric.NewRegistry().Histogram("x_seconds", "X.", buckets, "handler_name", "success")
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.Observe(0.02, "ymir:triage#0", "true")
			}
		})
	})
	b.Run("client_golang", func(b *testing.B) {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "x_seconds", Help: "X.", Buckets: buckets},
			[]string{"handler_name", "success"})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.WithLabelValues("ymir:triage#0", "true").Observe(0.02)
			}
		})
	})
}
