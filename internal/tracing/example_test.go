package tracing_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/internal/tracing"
)

// A command builds its provider with New (off unless configured) and hands
// TracerProvider() to the libraries' configs; tests trace into the SDK's in-memory
// exporter with NewProvider.
func Example() {
	off, _ := tracing.New(context.Background(), tracing.Config{})
	fmt.Println("off:", off.TracerProvider() == nil)

	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewProvider(tracing.Config{ServiceName: "ymirflow", Command: "worker"}, sdktrace.WithSyncer(exp))
	_, span := tp.Tracer("example").Start(context.Background(), "process ymir:triage")
	span.End()
	fmt.Println(len(exp.GetSpans()), exp.GetSpans()[0].Name)
	// Output:
	// off: true
	// 1 process ymir:triage
}
