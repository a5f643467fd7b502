package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/runners"
)

// run runs the agent, or, when an earlier attempt's run returned already, takes its
// result; either way it then accounts for the run's follow-ups. accounting is true when
// only that failed: the result stands (kept in the progress), and the retry accounts
// again without running the agent.
func (h *handler) run(ctx context.Context, ev *job) (res runners.Result, accounting bool, err error) {
	if ev.p.ran == nil {
		r, err := h.runAgent(ctx, ev)
		if err != nil {
			return runners.Result{}, false, err
		}
		ev.p.ran = r
	}
	if err := h.closeMailbox(ctx, ev, ev.p.ran); err != nil {
		return runners.Result{}, true, err
	}
	res = ev.p.ran.res
	ev.p.ran = nil
	return res, false, nil
}

func (h *handler) runAgent(ctx context.Context, ev *job) (*ranRun, error) {
	if err := aborted(ctx); err != nil {
		return nil, err
	}
	req := runners.RunRequest{
		Agent: h.cfg.Agent, Branch: h.cfg.Branch, IssueKey: ev.key, Fence: ev.fence, Attempt: ev.delivery,
		MessageID: event.EntryID(ev.msg), Stream: event.EntryStream(ev.msg), UserTriggered: ev.userTriggered,
		Payload: ev.msg.Payload, Task: ev.task,
	}
	mr, err := h.openMailbox(ctx, ev, &req)
	if err != nil {
		return nil, err
	}
	ch, err := h.openControl(ctx, ev, &req)
	if err != nil {
		return nil, err
	}
	defer h.watchProgress(ctx, ch)()
	start := h.now()
	rctx, span := h.span(ctx, ev, "runner "+h.cfg.Agent)
	res, err := h.cfg.Runner.Run(rctx, req)
	controlAttributes(span, ch)
	h.endSpan(span, err)
	if err != nil {
		return nil, err
	}
	if a := aborted(ctx); a != nil {
		return nil, fmt.Errorf("runner result discarded: %w", a)
	}
	if h.cfg.Agent == "triage" && !slices.Contains(runners.Resolutions, res.Resolution) {
		return nil, fmt.Errorf("%w: unknown resolution %q", runners.ErrBadOutput, res.Resolution)
	}
	ev.log.Debug().Dur("took", h.now().Sub(start)).Msg("runner returned")
	return accountFor(mr, res), nil
}

// record writes ev's terminal record (stage.done, stage.failed): once per event, by
// whichever worker and attempt writes it first (Results.AddOnce).
func (h *handler) record(ctx context.Context, ev *job, eventType, outcome string, detail any) error {
	return h.recordOnce(ctx, ev, h.outcomeOnce(ev.msg), eventType, outcome, detail)
}

// recordOnce writes a record named once: a second write of it adds nothing.
func (h *handler) recordOnce(ctx context.Context, ev *job, once, eventType, outcome string, detail any) error {
	rec := event.RecordFor(ev.msg, h.cfg.Agent, eventType)
	rec.IssueKey = ev.key
	rec.Outcome = outcome
	if detail != nil {
		b, err := json.Marshal(detail)
		if err != nil {
			return err
		}
		rec.Detail = string(b)
	}
	rctx, span := h.span(ctx, ev, "record "+eventType, attribute.String("ymirflow.outcome", outcome))
	_, err := h.cfg.Results.AddOnce(rctx, rec, once)
	h.endSpan(span, err)
	if err != nil {
		return h.redisErr(ctx, ev, "record the outcome", err)
	}
	return nil
}
