package fetcher

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
)

// noSpan records nothing: the span of a fetcher without a tracer.
var noSpan = trace.SpanFromContext(context.Background())

// startSpan starts a sweep's or a webhook batch's span: a child of ctx's span (the
// webhook delivery's), or a new trace for a sweep.
func (f *Fetcher) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if f.tracer == nil {
		return ctx, noSpan
	}
	return f.tracer.Start(ctx, name)
}

func (f *Fetcher) endSpan(span trace.Span, sum Summary, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("ymirflow.found", sum.Found), attribute.Int("ymirflow.published", sum.Published))
		event.RecordError(span, err, event.ErrorType(err), nil)
	}
	span.End()
}

// startPublish starts the span of one triage request's publish and writes its
// traceparent into msg, so the triage worker's span continues this trace.
func (f *Fetcher) startPublish(ctx context.Context, stream string, msg *message.Message) (context.Context, trace.Span) {
	if f.tracer == nil {
		event.InjectTrace(ctx, msg)
		return ctx, noSpan
	}
	ctx, span := event.StartPublish(ctx, f.tracer, stream, msg)
	event.InjectTrace(ctx, msg)
	return ctx, span
}

func (f *Fetcher) endPublish(span trace.Span, id string, fresh bool, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(attribute.Bool("ymirflow.already_queued", err == nil && !fresh))
	event.EndPublish(span, id, err)
}
