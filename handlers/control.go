package handlers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/runners"
)

// BudgetExhausted is the typed outcome (record event type) of a run that ended because
// a reservation was denied for its budget; the issue is parked until a raise.
const BudgetExhausted = "budget.exhausted"

// LabelBudgetExhausted parks an issue whose budget is exhausted: added beside the
// issue's state labels, and removed by the next state a run asserts (a resumed run's
// outcome, a claim).
const LabelBudgetExhausted = labels.BudgetExhausted

// openControl gives a run under a lease its control channel and puts the last
// checkpoint of the issue's agent into its Task JSON. Nil without Config.Ledger or a
// lease.
func (h *handler) openControl(ctx context.Context, ev *job, req *runners.RunRequest) (*agentctl.Channel, error) {
	if h.cfg.Ledger == nil {
		return nil, nil
	}
	le, ok := lockmw.LeaseFrom(ctx)
	if !ok {
		return nil, nil
	}
	ck, found, err := h.cfg.Ledger.LastCheckpoint(ctx, h.cfg.Agent, ev.key)
	if err != nil {
		return nil, h.redisErr(ctx, ev, "read the checkpoint", err)
	}
	if found {
		payload, err := runners.WithCheckpoint(req.Payload, ck.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", event.ErrBadEvent, err)
		}
		req.Payload = payload
		ev.log.Info().Int64("checkpoint_fence", ck.Fence).Msg("run resumes from the issue's last checkpoint")
	}
	opts := h.cfg.Control
	opts.Logger = ev.log
	ch := h.cfg.Ledger.Open(agentctl.RunOf(le), opts)
	req.Control = ch
	return ch, nil
}

// watchProgress gives the run's lease up when its agent reports no progress on ch for
// the progress timeout (agentctl.ChannelOptions.ProgressTimeout), as a wedged
// handler's ends at MaxHold: the runner is stopped, the event stays pending and runs
// again, from the last checkpoint. It returns the watch's stop, for the run's end.
func (h *handler) watchProgress(ctx context.Context, ch *agentctl.Channel) (stop func()) {
	le, ok := lockmw.LeaseFrom(ctx)
	if !ok || ch == nil || h.cfg.Control.ProgressTimeout <= 0 {
		return func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	go ch.WatchProgress(wctx, le.GiveUp)
	return cancel
}

// controlAttributes puts what the run reported, counted, on its span.
func controlAttributes(span trace.Span, ch *agentctl.Channel) {
	if ch == nil {
		return
	}
	t := ch.Totals()
	span.SetAttributes(attribute.Float64("ymirflow.cost_usd", agentctl.USD(t.Micro)),
		attribute.Int64("ymirflow.tokens_in", t.TokensIn), attribute.Int64("ymirflow.tokens_out", t.TokensOut),
		attribute.Int64("ymirflow.tool_calls", t.ToolCalls), attribute.Int64("ymirflow.usage_reports", t.Reports),
		attribute.Bool("ymirflow.budget_exhausted", ch.Exhausted()))
}

// budgetExhausted ends a run that stopped for its budget: the issue gets the park
// label and, once per budget level, a comment asking for more; the request is kept to
// be published again when the budget is raised; the outcome is recorded as
// budget.exhausted and the event is acknowledged (never retried: a retry would be
// denied again).
func (h *handler) budgetExhausted(ctx context.Context, ev *job, cause error) error {
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%s of %s interrupted: %w: %w", h.cfg.Agent, ev.key, a, cause)
	}
	if !ev.p.labelled {
		if err := h.setLabels(ctx, ev, []string{LabelBudgetExhausted}, nil); err != nil {
			return h.jiraErr(ctx, ev, "write "+LabelBudgetExhausted, err)
		}
		ev.p.labelled = true
	}
	l := h.cfg.Ledger
	err := l.Park(ctx, ev.key, agentctl.Parked{Agent: h.cfg.Agent, Stream: event.EntryStream(ev.msg),
		EventType: ev.msg.Metadata.Get(event.MetaEventType), Payload: ev.msg.Payload})
	if err != nil {
		return h.redisErr(ctx, ev, "park the request", err)
	}
	first, err := h.askForBudget(ctx, ev)
	if err != nil {
		return err
	}
	detail := map[string]any{"label": LabelBudgetExhausted, "error": cause.Error(), "asked": first}
	if err := h.record(ctx, ev, BudgetExhausted, LabelBudgetExhausted, detail); err != nil {
		return err
	}
	ev.log.Warn().Bool("asked", first).Msg("budget exhausted: the issue is parked until a maintainer raises it")
	return h.end(ev, nil)
}

// askDeadline is how long an ask for more budget may take (the comment's post) before
// another run may take it over while the asker still holds its lease.
const askDeadline = 2 * time.Minute

// askForBudget posts the comment asking for more budget, at least once per budget
// level (agentctl.Ledger.BeginAsk): marked "asking", posted unless an earlier post is
// found by its marker (one whose process died before marking it), then marked
// "asked". It reports whether this run asked. A post that fails returns the error:
// the event is retried and asks again (the level is not marked asked).
func (h *handler) askForBudget(ctx context.Context, ev *job) (bool, error) {
	le, ok := lockmw.LeaseFrom(ctx)
	if !ok {
		return false, nil
	}
	l := h.cfg.Ledger
	ask, err := l.BeginAsk(ctx, ev.key, agentctl.RunOf(le), askDeadline)
	if err != nil {
		return false, h.redisErr(ctx, ev, "mark the budget request", err)
	}
	if ask.Status != agentctl.AskPost {
		ev.log.Info().Str("ask", ask.Status).Int64("budget_level", ask.Level).Msg("budget request not posted: asked already, or being asked")
		return false, nil
	}
	marker := ask.Marker(ev.key)
	if h.commented(ctx, ev, marker) {
		ev.log.Info().Int64("budget_level", ask.Level).Msg("budget request found posted before; marked asked")
	} else if err := h.postComment(ctx, ev, budgetComment(ev.key, l.Budgets())+"\n\n"+marker); err != nil {
		return false, h.jiraErr(ctx, ev, "ask for more budget", err)
	}
	if err := l.Asked(ctx, ev.key, ask); err != nil {
		return true, h.redisErr(ctx, ev, "mark the budget request asked", err)
	}
	return true, nil
}

func budgetComment(key string, b agentctl.Budgets) string {
	return fmt.Sprintf("ymirflow: the agents' budget for %s is exhausted (issue budget %.2f USD, per agent %.2f USD; 0 is none), "+
		"so the work is paused where it stood. A maintainer can approve more with a comment `/ymir budget +AMOUNT` "+
		"(USD) and the work resumes from its last checkpoint.", key, b.Issue, b.Agent)
}

// isBudgetExhausted reports whether a run's error is its budget's end.
func isBudgetExhausted(err error) bool { return errors.Is(err, runners.ErrBudgetExhausted) }
