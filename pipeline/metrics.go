package pipeline

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/metric"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Metrics are the process's Prometheus metrics: the handlers' execution time plus the
// lease's. Metrics implements lease.Observer.
type Metrics struct {
	// Registry is the process's registry: the other parts of the process (the agents'
	// channels, the rate limits, the webhook) make their families on it, and Health
	// serves it at /metrics.
	Registry *metric.Registry

	handler  *metric.Histogram
	acquired *metric.Counter
	busy     *metric.Counter
	conflict *metric.Counter
	lost     *metric.Counter
	hold     *metric.Histogram
	dead     *metric.Counter
	fenced   *metric.Counter
	// The wait policy's lines, per agent, as its line waker last found them.
	lines, waiting, longest *metric.Gauge
	// The concurrency limits' keys (RUN_LIMITS), as the slot waker last found them.
	slotsUsed, slotsLimit, slotsWaiting *metric.Gauge
}

var (
	_ lease.Observer      = (*Metrics)(nil)
	_ lockmw.LineObserver = (*Metrics)(nil)
	_ lockmw.SlotObserver = (*Metrics)(nil)
)

// handlerBuckets are the handler execution time's upper bounds (seconds): those of
// Watermill's Prometheus middleware, which this histogram replaces under its name.
var handlerBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// NewMetrics makes the metrics on reg, the process's registry; nil: a fresh one.
func NewMetrics(reg *metric.Registry) *Metrics {
	if reg == nil {
		reg = metric.NewRegistry()
	}
	return &Metrics{
		Registry: reg,
		handler: reg.Histogram("ymirflow_handler_execution_time_seconds",
			"The total time elapsed while executing the handler function in seconds", handlerBuckets, "handler_name", "success"),
		acquired: reg.Counter("ymirflow_lease_acquired_total", "Leases taken.", "agent"),
		busy: reg.Counter("ymirflow_lease_busy_total",
			"Events whose issue was locked by another holder (dropped or coalesced).", "agent"),
		conflict: reg.Counter("ymirflow_lock_conflicts_total",
			"Events for a busy issue, by outcome (dropped, coalesced, delivered, delayed, superseded, waited) and reason (locked, superseded, cancelled: a run taken over by a newer event).",
			"agent", "outcome", "reason"),
		lost: reg.Counter("ymirflow_lease_lost_total",
			"Leases lost while held, by cause (lost, unproven, max_hold, superseded: taken over by a newer event under the supersede busy policy).", "agent", "cause"),
		hold: reg.Histogram("ymirflow_lease_hold_seconds", "How long leases were held.",
			metric.ExponentialBuckets(0.001, 4, 12), "agent"),
		dead: reg.Counter("ymirflow_dead_letters_total", "Events moved to the dead-letter stream.", "agent"),
		fenced: reg.Counter("ymirflow_fenced_writes_total",
			"Jira writes made for an event whose lease was lost: refused before sending, or raced "+
				"(lost while in flight, labels converged), by target (labels, comment).", "agent", "target", "outcome"),
		lines: reg.Gauge("ymirflow_lock_lines",
			"Keys with events waiting in their line (busy policy wait), as the agent's line waker last found them.", "agent"),
		waiting: reg.Gauge("ymirflow_lock_waiting", "Events waiting in the agent's lines (busy policy wait).", "agent"),
		longest: reg.Gauge("ymirflow_lock_line_longest",
			"Events waiting in the agent's longest line (busy policy wait): the most waiting for one key.", "agent"),
		slotsUsed: reg.Gauge("ymirflow_run_slots_used",
			"Slots held of a concurrency limit key (lockmw.Limits), runs and hand-overs, as the slot waker last found them.", "key"),
		slotsLimit: reg.Gauge("ymirflow_run_slots_limit", "The limit of a concurrency limit key (lockmw.Limits).", "key"),
		slotsWaiting: reg.Gauge("ymirflow_run_slots_waiting",
			"Events waiting for a slot of a concurrency limit key (lockmw.Limits).", "key"),
	}
}

// handlerMiddleware times each handler run, by handler and whether it returned nil.
func (m *Metrics) handlerMiddleware() message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) (_ []*message.Message, err error) {
			start := time.Now()
			defer func() {
				success := "true"
				if err != nil {
					success = "false"
				}
				m.handler.Observe(time.Since(start).Seconds(), message.HandlerNameFromCtx(msg.Context()), success)
			}()
			return h(msg)
		}
	}
}

// Acquired implements lease.Observer.
func (m *Metrics) Acquired(agent string) { m.acquired.Inc(agent) }

// Busy implements lease.Observer.
func (m *Metrics) Busy(agent string) { m.busy.Inc(agent) }

// Conflict implements lease.Observer.
func (m *Metrics) Conflict(agent, outcome, reason string) {
	m.conflict.Inc(agent, outcome, reason)
}

// Lines implements lockmw.LineObserver.
func (m *Metrics) Lines(agent string, lines int, waiting, longest int64) {
	m.lines.Set(float64(lines), agent)
	m.waiting.Set(float64(waiting), agent)
	m.longest.Set(float64(longest), agent)
}

// Slots implements lockmw.SlotObserver: a key gone (nothing held, nothing waiting) is
// dropped.
func (m *Metrics) Slots(key string, used, limit, waiting int64) {
	if used == 0 && limit == 0 && waiting == 0 {
		m.slotsUsed.Delete(key)
		m.slotsLimit.Delete(key)
		m.slotsWaiting.Delete(key)
		return
	}
	m.slotsUsed.Set(float64(used), key)
	m.slotsLimit.Set(float64(limit), key)
	m.slotsWaiting.Set(float64(waiting), key)
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
	m.lost.Inc(agent, c)
}

// FencedWriteRefused implements handlers.FenceObserver.
func (m *Metrics) FencedWriteRefused(agent, target string) {
	m.fenced.Inc(agent, target, "refused")
}

// FencedWriteRaced implements handlers.FenceObserver.
func (m *Metrics) FencedWriteRaced(agent, target string) {
	m.fenced.Inc(agent, target, "raced")
}

// Released implements lease.Observer.
func (m *Metrics) Released(agent string, held time.Duration) {
	m.hold.Observe(held.Seconds(), agent)
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
		mux.Handle("/metrics", h.Metrics.Registry.Handler())
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
