package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const budgetHelp = `
budget approve KEY --usd N --reason WHY raises the budget of issue KEY (and of each of its agents) by
N USD, as a maintainer's approval does, and publishes again the requests whose runs
ended with budget.exhausted, so the work resumes from its last checkpoint. --once NAME
names the approval: given twice, it adds once.
`

func runBudget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Budget
	var key string
	return operator{name: "budget", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if len(s.pos) != 2 || s.pos[0] != "approve" {
				return usagef("budget approve KEY --usd N (got %q)", s.pos)
			}
			k, err := lease.Canonicalize(s.pos[1], lease.DefaultKeyPattern)
			if err != nil {
				return badKey(s.pos[1])
			}
			key = k
			return cfg.NeedReason("budget approve")
		},
		work: func(ctx context.Context, s *session) error {
			ctx = asOperator(ctx, &cfg.Writer)
			e := audit.OperatorFrom(ctx).Entry("budget approve", fmt.Sprintf("%s +%s USD", key, usd(cfg.USD)), key)
			return s.in.AuditLog().Do(ctx, e, func(ctx context.Context) error { return approveBudget(ctx, s, &cfg, key) })
		},
	}.run(ctx, args, stdout, stderr)
}

func approveBudget(ctx context.Context, s *session, cfg *config.Budget, key string) error {
	ledger, err := agentctl.NewLedger(s.rdb, s.topology.Namespace+":", agentctl.Budgets{})
	if err != nil {
		return err
	}
	once := cfg.Once
	if once == "" {
		once = "cli-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}
	raised, err := ledger.Raise(ctx, key, cfg.USD, once)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.stdout, "%s: budget raised by %s USD in total\n", key, usd(raised))
	return resumeParked(ctx, s, ledger, key, cfg.MaxLen, cfg.MaxEventBytes)
}

// resumeParked publishes again the requests of key parked for their budget, each
// forgotten only after its publish (idempotent by the parked request's id: approving
// again after a failure publishes nothing twice).
func resumeParked(ctx context.Context, s *session, ledger *agentctl.Ledger, key string, maxLen int64, maxBytes int) error {
	pub := event.NewPublisher(s.rdb, maxLen).WithMaxEventBytes(maxBytes)
	done, err := ledger.ResumeParked(ctx, key, func(ctx context.Context, p agentctl.Parked) (string, error) {
		task, err := event.ParseTask(p.Payload)
		if err != nil {
			return "", fmt.Errorf("%w: %w", agentctl.ErrParkedInvalid, err)
		}
		msg, err := event.New(p.EventType, key, task, nil)
		if err != nil {
			return "", fmt.Errorf("%w: %w", agentctl.ErrParkedInvalid, err)
		}
		return pub.PublishOnce(ctx, p.Stream, msg, p.OnceID(), agentctl.ParkedOnceTTL)
	})
	for _, d := range done {
		if d.Dropped != nil {
			fmt.Fprintf(s.stdout, "-\t%s\t%s dropped: %v\n", d.Stream, d.Agent, d.Dropped)
			continue
		}
		fmt.Fprintf(s.stdout, "%s\t%s\t%s resumed\n", d.EntryID, d.Stream, d.Agent)
	}
	return err
}
