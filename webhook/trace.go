package webhook

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
)

var noSpan = trace.SpanFromContext(context.Background())

// startDelivery starts the span of one stored delivery's classification: the first
// span of the issue run it starts (Jira sends no trace context).
func (r *Receiver) startDelivery(ctx context.Context, delivery, inboxID string, attempt int64) (context.Context, trace.Span) {
	if r.tracer == nil {
		return ctx, noSpan
	}
	return r.tracer.Start(ctx, "webhook delivery", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("ymirflow.webhook.delivery", delivery), attribute.String("ymirflow.webhook.inbox_id", inboxID),
		event.AttrAttempt.Int64(attempt)))
}

func endDelivery(span trace.Span, res result) {
	if span.IsRecording() {
		span.SetAttributes(event.AttrIssueKey.String(res.issue), attribute.String("ymirflow.webhook.outcome", res.outcome),
			attribute.Int("http.response.status_code", res.status), event.AttrStreamID.String(res.entryID))
		if res.status >= 500 {
			span.SetAttributes(event.AttrErrorType.String(res.outcome))
			span.SetStatus(codes.Error, res.outcome)
		}
	}
	span.End()
}
