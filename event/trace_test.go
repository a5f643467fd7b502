package event_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
)

// Without a span in the context, publishing and reading an entry touch no trace field
// and allocate nothing for tracing.
func TestTraceContextOffCostsNothing(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	msg := message.NewMessage("u", []byte(`{}`))
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() {
		event.InjectTrace(ctx, msg)
		_ = event.ExtractTrace(ctx, msg)
		_ = event.TraceLinks(msg)
	}); n != 0 {
		t.Fatalf("%v allocations with tracing off, want 0", n)
	}
	if msg.Metadata.Get(event.MetaTraceParent) != "" {
		t.Fatalf("traceparent written without a span: %v", msg.Metadata)
	}
}

func TestTraceParentRoundTripAndReplayLink(t *testing.T) {
	t.Parallel()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	sc, ok := event.ParseTraceParent(tp)
	if !ok || event.FormatTraceParent(sc) != tp {
		t.Fatalf("round trip of %s: %v %v", tp, sc, ok)
	}
	msg := message.NewMessage("u", []byte(`{}`))
	event.InjectTrace(trace.ContextWithSpanContext(context.Background(), sc), msg)
	if msg.Metadata.Get(event.MetaTraceParent) != tp {
		t.Fatalf("injected %v", msg.Metadata)
	}
	if got := trace.SpanContextFromContext(event.ExtractTrace(context.Background(), msg)); got.SpanID() != sc.SpanID() || !got.IsRemote() {
		t.Fatalf("extracted %v", got)
	}
	event.MarkReplay(msg)
	if msg.Metadata.Get(event.MetaTraceParent) != "" || msg.Metadata.Get(event.MetaTraceLink) != tp {
		t.Fatalf("after MarkReplay: %v", msg.Metadata)
	}
	links := event.TraceLinks(msg)
	if len(links) != 1 || links[0].SpanContext.SpanID() != sc.SpanID() {
		t.Fatalf("links %v", links)
	}
	if _, ok := event.ParseTraceParent("00-garbage"); ok {
		t.Fatal("a malformed traceparent parsed")
	}
}

// A publisher writes the span's W3C trace context into the entry's metadata; the worker
// that reads the entry continues that trace.
func ExampleInjectTrace() {
	sc, _ := event.ParseTraceParent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	msg := message.NewMessage("u", []byte(`{}`))
	event.InjectTrace(trace.ContextWithSpanContext(context.Background(), sc), msg)
	fmt.Println(msg.Metadata.Get(event.MetaTraceParent))
	parent := trace.SpanContextFromContext(event.ExtractTrace(context.Background(), msg))
	fmt.Println(parent.TraceID(), parent.IsRemote())
	// Output:
	// 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
	// 0af7651916cd43dd8448eb211c80319c true
}
