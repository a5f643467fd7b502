package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"

	"github.com/ymirflow/ymirflow/pipeline/event"
	"github.com/ymirflow/ymirflow/runners"
)

func (h *handler) run(ctx context.Context, ev *job) (runners.Result, error) {
	if err := aborted(ctx); err != nil {
		return runners.Result{}, err
	}
	req := runners.RunRequest{
		Agent: h.cfg.Agent, Branch: h.cfg.Branch, IssueKey: ev.key, Fence: ev.fence, Attempt: ev.delivery,
		MessageID: event.EntryID(ev.msg), Stream: event.EntryStream(ev.msg), UserTriggered: ev.userTriggered,
		Payload: ev.msg.Payload, Task: ev.task,
	}
	mr, err := h.openMailbox(ctx, ev, &req)
	if err != nil {
		return runners.Result{}, err
	}
	start := h.now()
	rctx, span := h.span(ctx, ev, "runner "+h.cfg.Agent)
	res, err := h.cfg.Runner.Run(rctx, req)
	h.endSpan(span, err)
	if err != nil {
		return runners.Result{}, err
	}
	if a := aborted(ctx); a != nil {
		return runners.Result{}, fmt.Errorf("runner result discarded: %w", a)
	}
	if h.cfg.Agent == "triage" && !slices.Contains(runners.Resolutions, res.Resolution) {
		return runners.Result{}, fmt.Errorf("%w: unknown resolution %q", runners.ErrBadOutput, res.Resolution)
	}
	if err := h.closeMailbox(ctx, ev, mr, res); err != nil {
		return runners.Result{}, err
	}
	ev.log.Debug().Dur("took", h.now().Sub(start)).Msg("runner returned")
	return res, nil
}

func (h *handler) record(ctx context.Context, ev *job, eventType, outcome string, detail any) error {
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
	_, err := h.cfg.Results.Add(rctx, rec)
	h.endSpan(span, err)
	if err != nil {
		return h.redisErr(ctx, ev, "record the outcome", err)
	}
	return nil
}
