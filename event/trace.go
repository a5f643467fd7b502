package event

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// Trace context in the envelope (docs/architecture.md, "Tracing"): the W3C trace
// context of the span that published an event travels in its metadata, so the stage
// that reads it continues the same trace.
const (
	// MetaTraceParent is the W3C traceparent of the publishing span.
	MetaTraceParent = "traceparent"
	// MetaTraceState is the W3C tracestate that goes with it, when there is one.
	MetaTraceState = "tracestate"
	// MetaTraceLink is the traceparent of the trace an event was replayed from: a
	// replay starts a trace of its own, linked to that one, never a child of it.
	MetaTraceLink = "trace_link"
)

// Span attribute keys that every layer uses (issue key, agent, branch, fence, stream
// id, attempt, consumer); values are never secrets: keys, names and numbers only.
const (
	AttrIssueKey = attribute.Key("ymirflow.issue_key")
	AttrAgent    = attribute.Key("ymirflow.agent")
	AttrBranch   = attribute.Key("ymirflow.branch")
	AttrFence    = attribute.Key("ymirflow.fence")
	AttrStreamID = attribute.Key("ymirflow.stream_id")
	AttrStream   = attribute.Key("ymirflow.stream")
	AttrAttempt  = attribute.Key("ymirflow.attempt")
	AttrConsumer = attribute.Key("ymirflow.consumer")
	attrEvent    = attribute.Key("ymirflow.event_type")
	// AttrErrorType is the typed cause of a failure (e.g. "lease_lost", "bad_event").
	AttrErrorType = attribute.Key("error.type")
)

// tracerName is the instrumentation scope of every tracer ymirflow takes from a
// TracerProvider.
const tracerName = "github.com/ymirflow/ymirflow"

// Tracer returns tp's ymirflow tracer, or nil for a nil tp (tracing off): callers test
// for nil and skip all tracing work, so the off path costs nothing.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracerName)
}

// metadataCarrier lets the OpenTelemetry propagators read and write a message's
// metadata.
type metadataCarrier message.Metadata

// Get implements propagation.TextMapCarrier.
func (c metadataCarrier) Get(key string) string { return c[key] }

// Set implements propagation.TextMapCarrier.
func (c metadataCarrier) Set(key, value string) { c[key] = value }

// Keys implements propagation.TextMapCarrier.
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var traceContext = propagation.TraceContext{}

// InjectTrace writes the trace context of ctx's span into msg's metadata (traceparent,
// tracestate). Without a valid span in ctx it writes nothing.
func InjectTrace(ctx context.Context, msg *message.Message) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	traceContext.Inject(ctx, metadataCarrier(msg.Metadata))
}

// ExtractTrace returns ctx with msg's published trace context as its remote parent (ctx
// unchanged when msg carries none).
func ExtractTrace(ctx context.Context, msg *message.Message) context.Context {
	if msg.Metadata.Get(MetaTraceParent) == "" {
		return ctx
	}
	return traceContext.Extract(ctx, metadataCarrier(msg.Metadata))
}

// ParseTraceParent returns the span context a W3C traceparent names.
func ParseTraceParent(tp string) (trace.SpanContext, bool) {
	if tp == "" {
		return trace.SpanContext{}, false
	}
	sc := trace.SpanContextFromContext(traceContext.Extract(context.Background(),
		propagation.MapCarrier{MetaTraceParent: tp}))
	return sc, sc.IsValid()
}

// FormatTraceParent returns the W3C traceparent of sc ("" for an invalid one).
func FormatTraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	traceContext.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[MetaTraceParent]
}

// MarkReplay turns msg's trace context into a link: the copy of an event that a replay
// publishes starts a new trace (its own publish span, or the consumer's) linked to the
// trace the original ran in.
func MarkReplay(msg *message.Message) {
	if tp := msg.Metadata.Get(MetaTraceParent); tp != "" {
		msg.Metadata.Set(MetaTraceLink, tp)
	}
	delete(msg.Metadata, MetaTraceParent)
	delete(msg.Metadata, MetaTraceState)
}

// TraceLinks returns the links a span about msg starts with: the trace msg was
// replayed from, if any.
func TraceLinks(msg *message.Message) []trace.Link {
	sc, ok := ParseTraceParent(msg.Metadata.Get(MetaTraceLink))
	if !ok {
		return nil
	}
	return []trace.Link{{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("ymirflow.link", "replay_of")}}}
}

// RecordError marks span failed by err: the status, the typed cause (AttrErrorType,
// typ) and an "exception" event whose message went through red, so no secret that an
// error text carries reaches the exporter. It does nothing on a span that does not
// record.
func RecordError(span trace.Span, err error, typ string, red *redact.Redactor) {
	if err == nil || !span.IsRecording() {
		return
	}
	msg := red.String(err.Error())
	span.SetAttributes(AttrErrorType.String(typ))
	span.AddEvent("exception", trace.WithAttributes(
		attribute.String("exception.type", typ),
		attribute.String("exception.message", msg)))
	span.SetStatus(codes.Error, msg)
}

// ErrorType names the typed cause of err among the event format's own (bad_event);
// other packages name theirs first and fall back to this, and to "error".
func ErrorType(err error) string {
	switch {
	case errors.Is(err, ErrBadEvent):
		return "bad_event"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

// StartPublish starts the producer span of publishing msg to stream (a child of ctx's
// span, or a new trace linked to the replayed one); inject its context into msg
// (InjectTrace) before encoding it, and end it with EndPublish.
func StartPublish(ctx context.Context, tracer trace.Tracer, stream string, msg *message.Message) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "redis"),
		attribute.String("messaging.destination.name", stream),
		attribute.String("messaging.operation.type", "send"),
		AttrIssueKey.String(msg.Metadata.Get(MetaIssueKey)),
		attrEvent.String(msg.Metadata.Get(MetaEventType)),
	}
	if f := msg.Metadata.Get(MetaFence); f != "" {
		attrs = append(attrs, AttrFence.String(f))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	if links := TraceLinks(msg); links != nil {
		opts = append(opts, trace.WithLinks(links...))
	}
	return tracer.Start(ctx, "publish "+stream, opts...)
}

// EndPublish ends a span of StartPublish with the entry's id, or the publish's error.
func EndPublish(span trace.Span, id string, err error) {
	if err != nil {
		RecordError(span, err, ErrorType(err), nil)
	} else {
		span.SetAttributes(AttrStreamID.String(id))
	}
	span.End()
}

// TraceDelivery is the key that holds the traceparent of the last delivery of a stream
// entry that a traced worker began: "<namespace>:trace:<stream>:<entry id>". The next
// delivery of the same entry (after a crash, a lost lease) swaps its own in and links
// its span to the one it finds, so a redelivered event's trace shows its first attempt.
func (t Topology) TraceDelivery(stream, id string) string {
	return t.ns() + ":trace:" + stream + ":" + id
}
