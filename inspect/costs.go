package inspect

import (
	"context"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
)

// IssueCost is an issue's spend as the agents reported it on their control channel
// (package agentctl's ledger, across every run and agent), counted once each.
type IssueCost struct {
	Issue     string             `json:"issue"`
	USD       float64            `json:"cost_usd"`
	ByAgent   map[string]float64 `json:"by_agent_usd"`
	TokensIn  int64              `json:"tokens_in"`
	TokensOut int64              `json:"tokens_out"`
	ToolCalls int64              `json:"tool_calls"`
	Reports   int64              `json:"reports"`
	// RaisedUSD is what maintainers' approvals added to the issue's budget.
	RaisedUSD float64 `json:"budget_raised_usd"`
}

// Cost reads issue's spend from the agents' ledger. Cost: one round trip (HGETALL).
func (in *Inspector) Cost(ctx context.Context, issue string) (IssueCost, error) {
	ns := in.topo.Namespace
	if ns == "" {
		ns = event.DefaultNamespace
	}
	ledger, err := agentctl.NewLedger(in.rdb, ns+":", agentctl.Budgets{})
	if err != nil {
		return IssueCost{}, err
	}
	c, err := ledger.Costs(ctx, issue)
	if err != nil {
		return IssueCost{}, err
	}
	out := IssueCost{Issue: c.Issue, USD: c.USD, ByAgent: make(map[string]float64, len(c.ByAgent)), TokensIn: c.TokensIn,
		TokensOut: c.TokensOut, ToolCalls: c.ToolCalls, Reports: c.Reports, RaisedUSD: c.RaisedUSD}
	for a, micro := range c.ByAgent {
		out.ByAgent[a] = agentctl.USD(micro)
	}
	return out, nil
}
