// Package tracing builds the OpenTelemetry SDK's TracerProvider that the commands hand
// to the libraries (docs/architecture.md, "Tracing"). It is the only non-test package
// that imports the SDK and its exporters: the libraries take a trace.TracerProvider
// from their configuration (nil: tracing off) and use the OpenTelemetry API alone.
//
// The settings come as fields; cmd/ymirflow/config reads them from the standard
// variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME) or
// flags. The standard variables that have no field here are read where every
// OpenTelemetry SDK reads them: the exporter's (OTEL_EXPORTER_OTLP_[TRACES_]HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY, _PROTOCOL,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) by its exporter here (otlphttp.go, which posts
// what otlpencode.go writes: ours, so that gRPC and the protobuf runtime stay out of the
// binary), checked when New runs; OTEL_RESOURCE_ATTRIBUTES and the sampler by the SDK.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Exporters: Config.Exporter's values.
const (
	// ExporterNone turns tracing off.
	ExporterNone = "none"
	// ExporterOTLP sends spans over OTLP/HTTP (protobuf) to Config.Endpoint.
	ExporterOTLP = "otlp"
)

// DefaultServiceName is the service.name of spans when Config.ServiceName is empty.
const DefaultServiceName = "ymirflow"

// ErrExporter is returned for an exporter name other than "", "none" and "otlp".
var ErrExporter = errors.New("tracing: unknown Config.Exporter")

// Config says whether and where spans go.
type Config struct {
	// Exporter is "otlp" (on), "none" (off) or "" (on when Endpoint is set: off by
	// default).
	Exporter string
	// Endpoint is the collector's OTLP/HTTP base URL (http://collector:4318); the
	// exporter posts to its /v1/traces. Empty with Exporter "otlp": the SDK's default
	// (http://localhost:4318).
	Endpoint string
	// ServiceName is the spans' service.name. Default: DefaultServiceName.
	ServiceName string
	// Command is the service.instance role: the ymirflow command (worker, webhook,
	// fetch); it becomes the resource attribute ymirflow.command.
	Command string
	// Version is the build's version (service.version); empty: none.
	Version string
}

// On reports whether c turns tracing on.
func (c Config) On() bool {
	switch c.Exporter {
	case ExporterOTLP:
		return true
	case "":
		return c.Endpoint != ""
	}
	return false
}

// Check validates c; errors name the field.
func (c Config) Check() error {
	switch c.Exporter {
	case "", ExporterNone, ExporterOTLP:
	default:
		return fmt.Errorf("%w %q: want %q or %q (OTLP over HTTP)", ErrExporter, c.Exporter, ExporterOTLP, ExporterNone)
	}
	if c.Endpoint != "" {
		if err := checkURL(c.Endpoint); err != nil {
			return fmt.Errorf("tracing: Config.Endpoint: %w", err)
		}
	}
	return nil
}

// Provider is a TracerProvider to hand to the libraries, and its Shutdown, which
// flushes the spans still batched.
type Provider struct {
	sdk *sdktrace.TracerProvider
}

// TracerProvider returns the provider for the libraries' configs: nil when tracing is
// off, so that they skip all tracing work.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk
}

// Shutdown flushes and stops the exporter (nothing when tracing is off).
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// New returns c's Provider: off (no SDK at all) unless c.On(). It makes no connection
// (the exporter connects when it first sends), so ctx is not used: it stays for callers
// and for an exporter that would connect.
func New(ctx context.Context, c Config) (*Provider, error) {
	return newWithEnv(ctx, c, os.Getenv)
}

// newWithEnv is New with the exporter's standard variables looked up by getenv.
func newWithEnv(_ context.Context, c Config, getenv func(string) string) (*Provider, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	if !c.On() {
		return &Provider{}, nil
	}
	exp, err := newOTLPExporter(c, getenv)
	if err != nil {
		return nil, err
	}
	return &Provider{sdk: NewProvider(c, sdktrace.WithBatcher(exp))}, nil
}

// NewProvider returns an SDK provider with c's resource and the given options (an
// exporter, a span processor): the tests' way to trace into the SDK's in-memory
// exporter (tracetest) exactly as the commands do into a collector.
func NewProvider(c Config, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	name := c.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(name)}
	if c.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(c.Version))
	}
	if c.Command != "" {
		attrs = append(attrs, commandAttr.String(c.Command))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		res = resource.NewSchemaless(attrs...)
	}
	return sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithResource(res)}, opts...)...)
}

// traceURL is the OTLP/HTTP traces URL under a collector's base URL, as the standard
// variable OTEL_EXPORTER_OTLP_ENDPOINT means it.
func traceURL(base string) string {
	u, _ := url.Parse(base)
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	return u.String()
}

// commandAttr is the resource attribute naming the ymirflow command.
const commandAttr = attribute.Key("ymirflow.command")
