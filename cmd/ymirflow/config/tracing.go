package config

import (
	"flag"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/tracing"
)

// Tracing is the OpenTelemetry settings of the commands on an issue run's path
// (worker, webhook, fetch, enqueue, replay). They are the standard OpenTelemetry
// variables, so a deployment that sets them for every service sets them for ymirflow
// too; this package reads them like every other setting (flag, --help, refused at start
// when invalid) and hands internal/tracing plain fields. The SDK reads the standard
// variables that have no setting here (the exporter's headers, timeout, certificate,
// OTEL_RESOURCE_ATTRIBUTES, the sampler) itself, as every OpenTelemetry SDK does; no
// ymirflow package outside this one names any of them.
type Tracing struct {
	// TracesExporter (--traces-exporter, OTEL_TRACES_EXPORTER): otlp, none, or empty
	// (on when an endpoint is set). Tracing is off by default.
	TracesExporter string
	// OTLPEndpoint (--otlp-endpoint, OTEL_EXPORTER_OTLP_ENDPOINT): the collector's
	// OTLP/HTTP base URL.
	OTLPEndpoint string
	// ServiceName (--service-name, OTEL_SERVICE_NAME): the spans' service.name.
	ServiceName string
}

func (t *Tracing) register(fs *flag.FlagSet) {
	stringVarEnv(fs, &t.TracesExporter, "traces-exporter", "OTEL_TRACES_EXPORTER", "",
		"where spans go: otlp (OTLP over HTTP to --otlp-endpoint) or none (empty: otlp when --otlp-endpoint is set, else none; tracing is off by default)")
	stringVarEnv(fs, &t.OTLPEndpoint, "otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "",
		"OpenTelemetry collector's OTLP/HTTP base URL, e.g. http://otel-collector:4318 (spans go to its /v1/traces; empty: none, or http://localhost:4318 with --traces-exporter otlp)")
	stringVarEnv(fs, &t.ServiceName, "service-name", "OTEL_SERVICE_NAME", "",
		"service.name of the spans (empty: "+tracing.DefaultServiceName+")")
}

func (t *Tracing) validate(p *problems) {
	if err := t.Config("").Check(); err != nil {
		switch {
		case !oneOf(t.TracesExporter, "", tracing.ExporterNone, tracing.ExporterOTLP):
			p.addEnv("traces-exporter", "OTEL_TRACES_EXPORTER", "= %q must be %s or %s", t.TracesExporter, tracing.ExporterOTLP, tracing.ExporterNone)
		default:
			p.addEnv("otlp-endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "= %q must be an http:// or https:// URL with a host and no credentials", redact.URL(t.OTLPEndpoint))
		}
	}
}

// Config is the tracing package's configuration for command.
func (t *Tracing) Config(command string) tracing.Config {
	return tracing.Config{Exporter: t.TracesExporter, Endpoint: t.OTLPEndpoint, ServiceName: t.ServiceName, Command: command}
}
