package pipeline

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Metrics are the process's Prometheus metrics: Watermill's handler metrics plus the
// lease's. Metrics implements lease.Observer.
type Metrics struct {
	Registry *prometheus.Registry
	builder  metrics.PrometheusMetricsBuilder

	acquired *prometheus.CounterVec
	busy     *prometheus.CounterVec
	conflict *prometheus.CounterVec
	lost     *prometheus.CounterVec
	hold     *prometheus.HistogramVec
	dead     *prometheus.CounterVec
	fenced   *prometheus.CounterVec
	// The wait policy's lines, per agent, as its line waker last found them.
	lines, waiting, longest *prometheus.GaugeVec
	// The concurrency limits' keys (RUN_LIMITS), as the slot waker last found them.
	slotsUsed, slotsLimit, slotsWaiting *prometheus.GaugeVec
}

var (
	_ lease.Observer      = (*Metrics)(nil)
	_ lockmw.LineObserver = (*Metrics)(nil)
	_ lockmw.SlotObserver = (*Metrics)(nil)
)

// NewMetrics registers the metrics on a fresh registry.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: reg,
		builder:  metrics.NewPrometheusMetricsBuilder(reg, "ymirflow", ""),
		acquired: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "lease_acquired_total",
			Help: "Leases taken."}, []string{"agent"}),
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "lease_busy_total",
			Help: "Events whose issue was locked by another holder (dropped or coalesced)."}, []string{"agent"}),
		conflict: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "lock_conflicts_total",
			Help: "Events for a busy issue, by outcome (dropped, coalesced, delivered, delayed, superseded, waited) and reason (locked, superseded, cancelled: a run taken over by a newer event)."},
			[]string{"agent", "outcome", "reason"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "lease_lost_total",
			Help: "Leases lost while held, by cause (lost, unproven, max_hold, superseded: taken over by a newer event under the supersede busy policy)."}, []string{"agent", "cause"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ymirflow", Name: "lease_hold_seconds",
			Help: "How long leases were held.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 12)}, []string{"agent"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "dead_letters_total",
			Help: "Events moved to the dead-letter stream."}, []string{"agent"}),
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "fenced_writes_total",
			Help: "Jira writes made for an event whose lease was lost: refused before sending, or raced " +
				"(lost while in flight, labels converged), by target (labels, comment)."}, []string{"agent", "target", "outcome"}),
	}
	m.lines = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ymirflow", Name: "lock_lines",
		Help: "Keys with events waiting in their line (busy policy wait), as the agent's line waker last found them."}, []string{"agent"})
	m.waiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ymirflow", Name: "lock_waiting",
		Help: "Events waiting in the agent's lines (busy policy wait)."}, []string{"agent"})
	m.longest = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ymirflow", Name: "lock_line_longest",
		Help: "Events waiting in the agent's longest line (busy policy wait): the most waiting for one key."}, []string{"agent"})
	m.slotsUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ymirflow", Name: "run_slots_used",
		Help: "Slots held of a concurrency limit key (lockmw.Limits), runs and hand-overs, as the slot waker last found them."}, []string{"key"})
	m.slotsLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ymirflow", Name: "run_slots_limit",
		Help: "The limit of a concurrency limit key (lockmw.Limits)."}, []string{"key"})
	m.slotsWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ymirflow", Name: "run_slots_waiting",
		Help: "Events waiting for a slot of a concurrency limit key (lockmw.Limits)."}, []string{"key"})
	reg.MustRegister(m.acquired, m.busy, m.conflict, m.lost, m.hold, m.dead, m.fenced, m.lines, m.waiting, m.longest,
		m.slotsUsed, m.slotsLimit, m.slotsWaiting)
	return m
}

func (m *Metrics) handlerMiddleware() message.HandlerMiddleware {
	return m.builder.NewRouterMiddleware().Middleware
}

// Acquired implements lease.Observer.
func (m *Metrics) Acquired(agent string) { m.acquired.WithLabelValues(agent).Inc() }

// Busy implements lease.Observer.
func (m *Metrics) Busy(agent string) { m.busy.WithLabelValues(agent).Inc() }

// Conflict implements lease.Observer.
func (m *Metrics) Conflict(agent, outcome, reason string) {
	m.conflict.WithLabelValues(agent, outcome, reason).Inc()
}

// Lines implements lockmw.LineObserver.
func (m *Metrics) Lines(agent string, lines int, waiting, longest int64) {
	m.lines.WithLabelValues(agent).Set(float64(lines))
	m.waiting.WithLabelValues(agent).Set(float64(waiting))
	m.longest.WithLabelValues(agent).Set(float64(longest))
}

// Slots implements lockmw.SlotObserver: a key gone (nothing held, nothing waiting) is
// dropped.
func (m *Metrics) Slots(key string, used, limit, waiting int64) {
	if used == 0 && limit == 0 && waiting == 0 {
		m.slotsUsed.DeleteLabelValues(key)
		m.slotsLimit.DeleteLabelValues(key)
		m.slotsWaiting.DeleteLabelValues(key)
		return
	}
	m.slotsUsed.WithLabelValues(key).Set(float64(used))
	m.slotsLimit.WithLabelValues(key).Set(float64(limit))
	m.slotsWaiting.WithLabelValues(key).Set(float64(waiting))
}

// Lost implements lease.Observer.
func (m *Metrics) Lost(agent string, cause error) {
	c := "lost"
	switch {
	case errors.Is(cause, lease.ErrLeaseUnproven):
		c = "unproven"
	case errors.Is(cause, lease.ErrMaxHold):
		c = "max_hold"
	case errors.Is(cause, lease.ErrSuperseded):
		c = "superseded" // policy supersede: a newer event took the lease over, not a fault
	}
	m.lost.WithLabelValues(agent, c).Inc()
}

// FencedWriteRefused implements handlers.FenceObserver.
func (m *Metrics) FencedWriteRefused(agent, target string) {
	m.fenced.WithLabelValues(agent, target, "refused").Inc()
}

// FencedWriteRaced implements handlers.FenceObserver.
func (m *Metrics) FencedWriteRaced(agent, target string) {
	m.fenced.WithLabelValues(agent, target, "raced").Inc()
}

// Released implements lease.Observer.
func (m *Metrics) Released(agent string, held time.Duration) {
	m.hold.WithLabelValues(agent).Observe(held.Seconds())
}

// Health serves /metrics, /healthz (the process is alive) and /readyz (Redis answers and
// the router runs).
type Health struct {
	// Metrics are served at /metrics. Default: nil, /metrics answers 404.
	Metrics *Metrics
	// Redis must answer PING for /readyz. Required.
	Redis redis.UniversalClient
	// Ready must report true for /readyz (a router's Healthy). Default: nil, not
	// checked.
	Ready func() bool
	// Limits bound the server's connections. Default: httpsrv's defaults.
	Limits httpsrv.Limits
}

// Handler returns the HTTP handler.
func (h Health) Handler() http.Handler {
	mux := http.NewServeMux()
	if h.Metrics != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(h.Metrics.Registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := h.Redis.Ping(ctx).Err(); err != nil {
			http.Error(w, "redis: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if h.Ready != nil && !h.Ready() {
			http.Error(w, "router not running", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// Serve listens on addr until ctx ends. It returns once listening (or failing to).
func (h Health) Serve(ctx context.Context, addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := httpsrv.New(h.Handler(), h.Limits)
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), nil
}
