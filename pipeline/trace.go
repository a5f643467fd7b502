package pipeline

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw"
)

// traceDeliveryTTL is how long a delivery's traceparent is kept for the entry's next
// delivery to link to: a redelivery comes after MaxIdleTime (minutes) or at once when
// the consumer restarts; an entry pending longer than this starts its link-less span.
const traceDeliveryTTL = 24 * time.Hour

// tracing is the consumer side of docs/architecture.md, "Tracing": one span per
// delivery, a child of the span that published the entry (its traceparent), so a
// stage's work joins the trace of the stage that asked for it. It is in the stack only
// when RouterConfig.TracerProvider is set; the stack without it is unchanged.
type tracing struct {
	tracer   trace.Tracer
	rdb      redis.UniversalClient
	topo     event.Topology
	group    string
	base     []attribute.KeyValue // agent, branch, consumer
	redactor *redact.Redactor
}

func (t *tracing) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (out []*message.Message, err error) {
		parent := msg.Context()
		stream, id := event.EntryStream(msg), event.EntryID(msg)
		attrs := append(append(make([]attribute.KeyValue, 0, len(t.base)+8), t.base...),
			attribute.String("messaging.system", "redis"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", stream),
			attribute.String("messaging.consumer.group.name", t.group),
			attribute.String("messaging.message.id", msg.UUID),
			event.AttrStream.String(stream),
			event.AttrStreamID.String(id),
			event.AttrIssueKey.String(msg.Metadata.Get(event.MetaIssueKey)),
		)
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
		if links := event.TraceLinks(msg); links != nil {
			opts = append(opts, trace.WithLinks(links...))
		}
		ctx, span := t.tracer.Start(event.ExtractTrace(parent, msg), "process "+stream, opts...)
		defer span.End()
		if id != "" && stream != "" {
			t.linkPrevious(ctx, span, stream, id)
		}
		msg.SetContext(ctx)
		defer msg.SetContext(parent)
		out, err = h(msg)
		span.SetAttributes(event.AttrIssueKey.String(msg.Metadata.Get(event.MetaIssueKey)))
		if n, aerr := strconv.Atoi(msg.Metadata.Get(event.MetaAttempt)); aerr == nil {
			span.SetAttributes(event.AttrAttempt.Int(n))
		}
		if f := msg.Metadata.Get(event.MetaFence); f != "" {
			if n, ferr := strconv.ParseInt(f, 10, 64); ferr == nil {
				span.SetAttributes(event.AttrFence.Int64(n))
			}
		}
		event.RecordError(span, err, errorType(err), t.redactor)
		return out, err
	}
}

// linkPrevious records this delivery's span under the entry's key and, in the same
// command (SET ... GET), learns the previous delivery's: this span then links to it.
// A worker killed mid-run leaves its delivery's span unended (never exported); the
// redelivery's link still names it, and the trace is the same one (both are children of
// the publishing span). Failing to record costs the link only.
func (t *tracing) linkPrevious(ctx context.Context, span trace.Span, stream, id string) {
	key := t.topo.TraceDelivery(stream, id)
	prev, err := t.rdb.SetArgs(ctx, key, event.FormatTraceParent(span.SpanContext()),
		redis.SetArgs{Get: true, TTL: traceDeliveryTTL}).Result()
	if err != nil {
		return // redis.Nil: the first delivery
	}
	if sc, ok := event.ParseTraceParent(prev); ok {
		span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("ymirflow.link", "previous_delivery")}})
		span.SetAttributes(attribute.Bool("ymirflow.redelivered", true))
	}
}

// errorType names err's typed cause for a span: the lease's, a transient failure, a
// bad event, or "error".
func errorType(err error) string {
	if err == nil {
		return ""
	}
	if t := lockmw.LeaseErrorType(err); t != "" {
		return t
	}
	if errors.Is(err, redeliver.ErrTransient) {
		return "transient"
	}
	return event.ErrorType(err)
}

// deadLettered marks the delivery's span with the dead letter it became.
func deadLettered(msg *message.Message, cause error, attempts int) {
	span := trace.SpanFromContext(msg.Context())
	if !span.IsRecording() {
		return
	}
	span.AddEvent("dead_lettered", trace.WithAttributes(event.AttrAttempt.Int(attempts),
		event.AttrErrorType.String(errorType(cause))))
}

func traceBase(agent, branch, consumer string) []attribute.KeyValue {
	base := []attribute.KeyValue{event.AttrAgent.String(agent), event.AttrConsumer.String(consumer)}
	if branch != "" {
		base = append(base, event.AttrBranch.String(branch))
	}
	return base
}
