package main

import (
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// controlChannel builds the agents' control channel of a worker: the ledger with the
// budgets, the permits, the counters. The exec runner alone has one; on Redis Cluster
// (the lease's cluster key layout) none, said at start: its scripts read the lease's
// keys beside the ledger's.
func controlChannel(e *env, cfg *config.Worker, locker *lease.Locker, m *pipeline.Metrics, log zerolog.Logger) (*agentctl.Ledger, agentctl.ChannelOptions, error) {
	if cfg.Runner != "exec" {
		return nil, agentctl.ChannelOptions{}, nil
	}
	if locker.Format() != lease.KeysCompat {
		log.Warn().Msg("the agents' control channel (YMIR_CONTROL_FD: usage, budgets, checkpoints, permits) is off on Redis Cluster")
		return nil, agentctl.ChannelOptions{}, nil
	}
	prefix := e.topology.Namespace + ":"
	ledger, err := agentctl.NewLedger(e.rdb, prefix, agentctl.Budgets{Issue: cfg.BudgetIssueUSD, Agent: cfg.BudgetAgentUSD})
	if err != nil {
		return nil, agentctl.ChannelOptions{}, usagef("%v", err)
	}
	rates, err := cfg.PermitRates()
	if err != nil {
		return nil, agentctl.ChannelOptions{}, usagef("PERMITS (--permits) = %q: %v", cfg.Permits, err)
	}
	opts := agentctl.ChannelOptions{Observer: agentctl.NewMetrics(m.Registry), ProgressTimeout: cfg.ProgressTimeout}
	if len(rates) > 0 {
		p, err := agentctl.NewRedisPermits(e.rdb, prefix, rates)
		if err != nil {
			return nil, agentctl.ChannelOptions{}, usagef("PERMITS (--permits) = %q: %v", cfg.Permits, err)
		}
		opts.Permits = p
	}
	log.Info().Float64("budget_issue_usd", cfg.BudgetIssueUSD).Float64("budget_agent_usd", cfg.BudgetAgentUSD).
		Str("permits", cfg.Permits).Dur("progress_timeout", cfg.ProgressTimeout).Msg("agents' control channel on (YMIR_CONTROL_FD)")
	return ledger, opts, nil
}
