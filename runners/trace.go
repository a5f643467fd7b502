package runners

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// appendTraceEnv adds TRACEPARENT (and TRACESTATE when there is one) for the span in
// ctx, the environment variables by which OpenTelemetry SDKs take up a parent's trace
// in a child process; any the worker's environment passed on are replaced, so an agent
// never continues a trace that is not its run's. Without a span env is returned as is.
func appendTraceEnv(ctx context.Context, env []string) []string {
	env = dropEnv(env, "TRACEPARENT", "TRACESTATE")
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return env
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	if tp := c.Get("traceparent"); tp != "" {
		env = append(env, "TRACEPARENT="+tp)
	}
	if ts := c.Get("tracestate"); ts != "" {
		env = append(env, "TRACESTATE="+ts)
	}
	return env
}

func dropEnv(env []string, names ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			if name == n {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
