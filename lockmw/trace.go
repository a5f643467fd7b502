package lockmw

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The lease's outcomes are events on the span of the message being handled (the
// pipeline's consumer span, in the message's context), not spans of their own: an
// acquire is one round trip, and a drop or a coalesce ends the event. Each helper
// returns at once when that span does not record (tracing off), so the path costs a
// context lookup and allocates nothing.

func leaseAcquired(ctx context.Context, le *lease.Lease, handedOff bool) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(event.AttrIssueKey.String(le.Issue()), event.AttrFence.Int64(le.Fence()))
	span.AddEvent("lease.acquired", trace.WithAttributes(event.AttrFence.Int64(le.Fence()),
		attribute.Bool("ymirflow.lease.handed_off", handedOff)))
}

// leaseConflict records a busy issue's outcome: dropped, coalesced (and whatever other
// outcome the busy policy names), with the reason and the holder.
func leaseConflict(ctx context.Context, outcome, reason string, holder lease.Info) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String("ymirflow.lease.outcome", outcome))
	span.AddEvent("lease."+outcome, trace.WithAttributes(
		attribute.String("ymirflow.lease.reason", reason),
		attribute.String("ymirflow.lease.holder", holder.Owner),
		attribute.Int64("ymirflow.lease.holder_fence", holder.Fence),
		attribute.String("ymirflow.lease.holder_message_id", holder.MessageID)))
}

// leaseEnded records the lease's end under the handler with its typed cause.
func leaseEnded(ctx context.Context, cause error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.AddEvent("lease.lost", trace.WithAttributes(event.AttrErrorType.String(LeaseErrorType(cause))))
}

// LeaseErrorType names a lease error's typed cause for traces and logs ("lease_lost",
// "lease_unproven", "max_hold", "locked", "superseded", "invalid_key"), or "" when err
// is none of the lease's.
func LeaseErrorType(err error) string {
	var locked *lease.LockedError
	var superseded *lease.SupersededError
	switch {
	case errors.Is(err, lease.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, lease.ErrLeaseUnproven):
		return "lease_unproven"
	case errors.Is(err, lease.ErrMaxHold):
		return "max_hold"
	case errors.Is(err, lease.ErrInvalidKey):
		return "invalid_key"
	case errors.As(err, &locked):
		return "locked"
	case errors.As(err, &superseded):
		return "superseded"
	}
	return ""
}
