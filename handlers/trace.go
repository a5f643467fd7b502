package handlers

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/runners"
)

// noSpan is the span of a handler without a tracer: it records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// span starts a child span of ctx's (the delivery's) named name, with the job's
// identity; without a tracer it returns ctx and a span that records nothing, at no cost.
func (h *handler) span(ctx context.Context, ev *job, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if h.tracer == nil {
		return ctx, noSpan
	}
	base := []attribute.KeyValue{event.AttrIssueKey.String(ev.key), event.AttrAgent.String(h.cfg.Agent),
		event.AttrFence.Int64(ev.fence), event.AttrAttempt.Int(ev.delivery), event.AttrStreamID.String(event.EntryID(ev.msg))}
	if h.cfg.Branch != "" {
		base = append(base, event.AttrBranch.String(h.cfg.Branch))
	}
	return h.tracer.Start(ctx, name, trace.WithAttributes(append(base, attrs...)...))
}

// endSpan ends span with err's typed cause (nothing for a span that does not record).
func (h *handler) endSpan(span trace.Span, err error) {
	if err != nil {
		event.RecordError(span, err, handlerErrorType(err), h.cfg.Redactor)
	}
	span.End()
}

// handlerErrorType names the typed cause of a handler step's failure.
func handlerErrorType(err error) string {
	if t := lockmw.LeaseErrorType(err); t != "" {
		return t
	}
	switch {
	case errors.Is(err, errCleanFailure):
		return "agent_failed"
	case errors.Is(err, runners.ErrBadOutput):
		return "bad_output"
	case errors.Is(err, lease.ErrReleased):
		return "lease_released"
	}
	return event.ErrorType(err)
}
