package agentctl

import (
	"sync"

	"github.com/ymirflow/ymirflow/internal/metric"
)

// maxModels bounds the model label's values: an agent names its model, and its text
// must not grow the metrics without bound; later ones count as "other".
const maxModels = 32

// Metrics is the channels' Prometheus counters (an Observer).
type Metrics struct {
	cost, tokens, tools, requests *metric.Counter

	mu     sync.Mutex
	models map[string]bool
}

var _ Observer = (*Metrics)(nil)

// NewMetrics makes the counters on reg.
func NewMetrics(reg *metric.Registry) *Metrics {
	return &Metrics{models: map[string]bool{},
		cost: reg.Counter("ymirflow_agent_cost_usd_total",
			"What the agents reported spending, counted once per report, by agent and model.", "agent", "model"),
		tokens: reg.Counter("ymirflow_agent_tokens_total",
			"Tokens the agents reported, by agent, model and direction (in, out).", "agent", "model", "direction"),
		tools: reg.Counter("ymirflow_agent_tool_calls_total", "Tool calls the agents reported, by agent.", "agent"),
		requests: reg.Counter("ymirflow_agent_control_requests_total",
			"Control channel requests, by agent, op and answer (granted, denied, stale_fence, bad_request, ...).", "agent", "op", "status"),
	}
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
	m.cost.Add(USD(micro), agent, model)
	m.tokens.Add(float64(tokensIn), agent, model, "in")
	m.tokens.Add(float64(tokensOut), agent, model, "out")
	m.tools.Add(float64(toolCalls), agent)
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
	m.requests.Inc(agent, op, status)
}
