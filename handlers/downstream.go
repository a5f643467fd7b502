package handlers

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// errCleanFailure marks a runner's {"success": false}.
var errCleanFailure = errors.New("agent reported failure")

func (h *handler) downstream(msg *message.Message) error {
	ctx := msg.Context()
	ev, err := h.begin(msg)
	if err != nil {
		return err
	}
	if ev.ended {
		return h.settle(ev)
	}
	p := ev.p
	agent := h.cfg.Agent
	if p.result == nil {
		res, accounting, err := h.run(ctx, ev)
		if accounting {
			return err // the run stands; the retry accounts for its follow-ups again
		}
		if err == nil && !res.Success {
			reason := res.Error
			if reason == "" {
				reason = "no reason given"
			}
			err = fmt.Errorf("%s of %s: %w: %s", agent, ev.key, errCleanFailure, reason)
		}
		if isBudgetExhausted(err) {
			return h.budgetExhausted(ctx, ev, err)
		}
		if err != nil {
			return h.downstreamFailed(ctx, ev, err)
		}
		p.result = &res
	}
	res := *p.result
	done := labels.DoneFor(agent)
	if !p.labelled {
		if err := h.setLabels(ctx, ev, []string{done}, otherState(done)); err != nil {
			return h.jiraErr(ctx, ev, "write "+done, err)
		}
		p.labelled = true
	}
	detail := map[string]any{"label": done, "merge_request_url": res.MergeRequestURL,
		"target_branch": ev.task.Str("target_branch"), "branch": h.cfg.Branch}
	if err := h.record(ctx, ev, event.StageDone, done, detail); err != nil {
		return err
	}
	ev.log.Info().Str("label", done).Str("merge_request_url", res.MergeRequestURL).Msg(agent + " done")
	return h.end(ev, nil)
}

func (h *handler) downstreamFailed(ctx context.Context, ev *job, cause error) error {
	agent := h.cfg.Agent
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%s of %s interrupted: %w: %w", agent, ev.key, a, cause)
	}
	if !ev.last {
		// Unlike upstream, ymir_triaged_<agent> stays until the last attempt: it is the
		// issue's only in-flight marker.
		if errors.Is(cause, errCleanFailure) && ev.userTriggered {
			if err := h.setLabels(ctx, ev, []string{labels.FailedFor(agent)}, nil); err != nil {
				ev.log.Warn().Err(err).Msg("could not write " + labels.FailedFor(agent) + " (not critical)")
			}
		}
		ev.log.Warn().Err(cause).Int("max_retries", h.cfg.MaxRetries).Msg(agent + " failed; it will be retried")
		return cause
	}
	wctx, cancel := writable(ctx)
	defer cancel()
	errored := labels.ErroredFor(agent)
	if !ev.p.labelled {
		if err := h.setLabels(wctx, ev, []string{errored}, otherState(errored)); err != nil {
			return h.jiraErr(wctx, ev, "write "+errored, err)
		}
		ev.p.labelled = true
	}
	if err := h.record(wctx, ev, event.StageFailed, errored,
		map[string]any{"error": cause.Error(), "attempts": ev.delivery, "branch": h.cfg.Branch}); err != nil {
		return err
	}
	ev.log.Error().Err(cause).Msg(agent + " failed on its last attempt: " + errored)
	return h.end(ev, recorded{fmt.Errorf("%s of %s failed %d times: %w", agent, ev.key, ev.delivery, cause)})
}
