package lockmw

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// slotsTaken records on the message's span the limit keys whose slots the run took.
func slotsTaken(ctx context.Context, limits []lease.Limit) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	keys := make([]string, len(limits))
	for i, l := range limits {
		keys[i] = l.Key
	}
	span.AddEvent("slots.taken", trace.WithAttributes(attribute.String("ymirflow.slots.keys", strings.Join(keys, ","))))
}

// slotWaiting records that the event waits for a slot of a full limit key.
func slotWaiting(ctx context.Context, w *lease.SlotsWaitingError) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("ymirflow.lease.outcome", "waiting_slot"))
	span.AddEvent("slots.waiting", trace.WithAttributes(
		attribute.String("ymirflow.slots.key", w.Limit.Key),
		attribute.Int64("ymirflow.slots.used", w.Used),
		attribute.Int64("ymirflow.slots.limit", w.Limit.N),
		attribute.Int64("ymirflow.slots.position", w.Position),
		attribute.Bool("ymirflow.slots.duplicate", w.Duplicate)))
}
