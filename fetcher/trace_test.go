package fetcher

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// A traced sweep is the root of each issue run's trace: its publish span is a child of
// the sweep's, and the entry carries that publish span's traceparent, which the triage
// worker continues.
func TestTracedSweepPublishesItsTraceParent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{iss("RHEL-1")})
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	if s := h.sweep(func(c *Config) { c.TracerProvider = tp }); s.Published != 1 {
		t.Fatalf("sweep: %s", s)
	}
	var sweep, publish tracetest.SpanStub
	for _, sp := range exp.GetSpans() {
		switch sp.Name {
		case "fetch sweep":
			sweep = sp
		case "publish " + h.topo.Stream("triage", "", false):
			publish = sp
		}
	}
	if !sweep.SpanContext.IsValid() || !publish.SpanContext.IsValid() {
		t.Fatalf("spans %v: want the sweep's and its publish's", exp.GetSpans())
	}
	if sweep.Parent.IsValid() || publish.Parent.SpanID() != sweep.SpanContext.SpanID() || publish.SpanContext.TraceID() != sweep.SpanContext.TraceID() {
		t.Fatal("the publish span is not the sweep's child")
	}
	entries := h.streamEntries()
	if len(entries) != 1 || entries[0].Meta[event.MetaTraceParent] != event.FormatTraceParent(publish.SpanContext) {
		t.Fatalf("entry metadata %v: want the publish span's traceparent %s", entries[0].Meta, event.FormatTraceParent(publish.SpanContext))
	}
	// Untraced, the entry carries no trace context.
	h2 := newHarness(t, []fakejira.Issue{iss("RHEL-2")})
	h2.sweep()
	if e := h2.streamEntries(); len(e) != 1 || e[0].Meta[event.MetaTraceParent] != "" {
		t.Fatalf("untraced entry %v", e)
	}
}
