package main

import (
	"context"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/tracing"
)

// startTracing builds the command's TracerProvider from its settings: nil when tracing
// is off (the default), which the libraries take as "no tracing at all". stop flushes
// the spans still batched; call it once the command's work has ended.
func startTracing(ctx context.Context, cfg *config.Tracing, command string, log zerolog.Logger) (tp trace.TracerProvider, stop func(), err error) {
	p, err := tracing.New(ctx, cfg.Config(command))
	if err != nil {
		return nil, nil, usagef("%v", err)
	}
	tp = p.TracerProvider()
	if tp == nil {
		return nil, func() {}, nil
	}
	log.Info().Str("otlp_endpoint", redact.URL(cfg.OTLPEndpoint)).Str("service_name", cfg.ServiceName).Msg("tracing on: spans go to the OpenTelemetry collector")
	// The SDK reports a failed export to OpenTelemetry's process-wide handler, which
	// would print it unstructured; the command owns the process, so it goes to our log.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn().Err(err).Msg("tracing: spans not exported")
	}))
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(sctx); err != nil {
			log.Warn().Err(err).Msg("tracing: spans not flushed at exit")
		}
	}, nil
}
