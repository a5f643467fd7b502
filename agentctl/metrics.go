package agentctl

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// maxModels bounds the model label's values: an agent names its model, and its text
// must not grow the metrics without bound; later ones count as "other".
const maxModels = 32

// Metrics is the channels' Prometheus counters (an Observer).
type Metrics struct {
	cost, tokens, tools, requests *prometheus.CounterVec

	mu     sync.Mutex
	models map[string]bool
}

var _ Observer = (*Metrics)(nil)

// NewMetrics registers the counters on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{models: map[string]bool{},
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "agent_cost_usd_total",
			Help: "What the agents reported spending, counted once per report, by agent and model."}, []string{"agent", "model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "agent_tokens_total",
			Help: "Tokens the agents reported, by agent, model and direction (in, out)."}, []string{"agent", "model", "direction"}),
		tools: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "agent_tool_calls_total",
			Help: "Tool calls the agents reported, by agent."}, []string{"agent"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ymirflow", Name: "agent_control_requests_total",
			Help: "Control channel requests, by agent, op and answer (granted, denied, stale_fence, bad_request, ...)."}, []string{"agent", "op", "status"}),
	}
	reg.MustRegister(m.cost, m.tokens, m.tools, m.requests)
	return m
}

// Usage implements Observer.
func (m *Metrics) Usage(agent, model string, micro, tokensIn, tokensOut, toolCalls int64) {
	m.mu.Lock()
	if !m.models[model] && len(m.models) >= maxModels {
		model = "other"
	} else {
		m.models[model] = true
	}
	m.mu.Unlock()
	m.cost.WithLabelValues(agent, model).Add(USD(micro))
	m.tokens.WithLabelValues(agent, model, "in").Add(float64(tokensIn))
	m.tokens.WithLabelValues(agent, model, "out").Add(float64(tokensOut))
	m.tools.WithLabelValues(agent).Add(float64(toolCalls))
}

// Request implements Observer.
func (m *Metrics) Request(agent, op, status string) {
	if op == "" {
		op = "unknown" // a line that did not parse: the agent's text never becomes a label
	}
	switch op {
	case OpUsage, OpReserve, OpCheckpoint, OpPermit, OpThrottled, "unknown":
	default:
		op = "unknown"
	}
	m.requests.WithLabelValues(agent, op, status).Inc()
}
