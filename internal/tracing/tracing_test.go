package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/ymirflow/ymirflow/internal/tracing"
)

func TestOffByDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []tracing.Config{{}, {Exporter: tracing.ExporterNone, Endpoint: "http://collector:4318"}, {ServiceName: "x"}} {
		p, err := tracing.New(context.Background(), c)
		if err != nil || p.TracerProvider() != nil {
			t.Fatalf("%+v: provider %v, err %v; want off (nil)", c, p.TracerProvider(), err)
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadConfigRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []tracing.Config{{Exporter: "jaeger"}, {Endpoint: "collector:4318"}, {Endpoint: "ftp://collector"},
		{Endpoint: "http://user:pw@collector:4318"}} {
		if _, err := tracing.New(context.Background(), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := tracing.New(context.Background(), tracing.Config{Exporter: "zipkin"}); !errors.Is(err, tracing.ErrExporter) {
		t.Errorf("unknown exporter: %v", err)
	}
}

// With an endpoint, spans go over OTLP/HTTP to its /v1/traces; Shutdown flushes them.
func TestOTLPExportsToTheEndpoint(t *testing.T) {
	t.Parallel()
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	p, err := tracing.New(context.Background(), tracing.Config{Endpoint: srv.URL, Command: "worker"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "one")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 {
		t.Fatal("no span reached the collector")
	}
}
