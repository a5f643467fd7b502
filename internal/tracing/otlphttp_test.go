package tracing

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ymirflow/ymirflow/internal/tracing/collectortest"
)

// env is a getenv over a map: the tests set the exporter's variables without t.Setenv,
// so they run in parallel.
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// decode reads a request as a collector does; a failure fails the test.
func decode(t *testing.T, r *http.Request) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	req, err := collectortest.Decode(r)
	if err != nil {
		t.Error(err)
	}
	return req
}

// spans are ended spans with these names, each of its own resource (service.name n).
func spans(names ...string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, n := range names {
		out = append(out, tracetest.SpanStub{Name: n, Resource: resource.NewSchemaless(attribute.String("service.name", n))}.Snapshot())
	}
	return out
}

func testExporter(t *testing.T, c Config, getenv func(string) string) *otlpExporter {
	t.Helper()
	cl, err := newOTLPExporter(c, getenv)
	if err != nil {
		t.Fatal(err)
	}
	cl.retry = retryPolicy{first: 10 * time.Millisecond, max: 40 * time.Millisecond, total: 2 * time.Second}
	t.Cleanup(func() { _ = cl.Shutdown(context.Background()) })
	return cl
}

// Spans from New reach the collector as the SDK's own exporter sends them: protobuf
// ExportTraceServiceRequest at /v1/traces, with the headers and compression of the
// standard variables (the TRACES_ form winning) and the resource of Config.
func TestOTLPRequestIsWhatACollectorReads(t *testing.T) {
	t.Parallel()
	got := make(chan *coltracepb.ExportTraceServiceRequest, 1)
	var hdr atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("%s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		}
		hdr.Store(r.Header.Clone())
		got <- decode(t, r)
	}))
	defer srv.Close()
	p, err := newWithEnv(context.Background(), Config{Endpoint: srv.URL, Command: "worker"}, env(
		"OTEL_EXPORTER_OTLP_HEADERS", "api-key=general",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=s%3Dcret, x-team = ops",
		"OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"))
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "process ymir:triage")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	req := <-got
	h := hdr.Load().(http.Header)
	if h.Get("Api-Key") != "s=cret" || h.Get("X-Team") != "ops" || h.Get("Content-Encoding") != "gzip" {
		t.Errorf("headers %v: want api-key s=cret, x-team ops, gzip", h)
	}
	rs := req.GetResourceSpans()
	if len(rs) != 1 || rs[0].GetScopeSpans()[0].GetSpans()[0].GetName() != "process ymir:triage" {
		t.Fatalf("request %v", req)
	}
	attrs := collectortest.Resource(rs[0])
	if attrs["service.name"] != DefaultServiceName || attrs["ymirflow.command"] != "worker" {
		t.Errorf("resource %v", attrs)
	}
}

// The HTTP protocols pass (http/json is sent as protobuf, which OTLP/HTTP receivers take
// too); gRPC is refused above.
func TestOTLPProtocolsOverHTTPPass(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"http/protobuf", "http/json"} {
		if _, err := newOTLPExporter(Config{Exporter: ExporterOTLP}, env("OTEL_EXPORTER_OTLP_PROTOCOL", p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// Several ResourceSpans are several field-1 entries of one request, in order.
func TestOTLPRequestCarriesEveryResource(t *testing.T) {
	t.Parallel()
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(encodeSpans(spans("a", "b", "c")), &req); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rs := range req.GetResourceSpans() {
		names = append(names, rs.GetScopeSpans()[0].GetSpans()[0].GetName())
	}
	if strings.Join(names, ",") != "a,b,c" {
		t.Fatalf("decoded %v", names)
	}
}

// A busy collector (429, 502, 503, 504) is retried after the wait it asks for; any
// other refusal is not, and its status and body are in the error.
func TestOTLPRetriesOnlyABusyCollector(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n := calls.Add(1); {
		case strings.HasPrefix(r.URL.Path, "/bad/"):
			http.Error(w, "no such tenant", http.StatusBadRequest)
		case n == 1:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		case n == 2:
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	cl := testExporter(t, Config{Endpoint: srv.URL}, env())
	if err := cl.ExportSpans(context.Background(), spans("a")); err != nil || calls.Load() != 3 {
		t.Fatalf("err %v after %d posts; want success on the third", err, calls.Load())
	}
	calls.Store(10)
	bad := testExporter(t, Config{Endpoint: srv.URL + "/bad"}, env())
	err := bad.ExportSpans(context.Background(), spans("a"))
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "no such tenant") || calls.Load() != 11 {
		t.Fatalf("err %v after %d posts; want one post and the 400 with its body", err, calls.Load()-10)
	}
}

// A collector busy for longer than the retry budget: the upload gives up with the
// collector's answer, and within the timeout when that is shorter.
func TestOTLPGivesUpOnAnAlwaysBusyCollector(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusBadGateway)
	}))
	defer srv.Close()
	cl := testExporter(t, Config{Endpoint: srv.URL}, env("OTEL_EXPORTER_OTLP_TIMEOUT", "150"))
	start := time.Now()
	err := cl.ExportSpans(context.Background(), spans("a"))
	if err == nil || !strings.Contains(err.Error(), "502") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v; want the 502 and the deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("gave up after %s", took)
	}
	cl.retry.total = 30 * time.Millisecond
	cl.timeout = time.Minute
	if err := cl.ExportSpans(context.Background(), spans("a")); err == nil || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("err %v; want given up within the retry budget", err)
	}
}

// A collector that accepts a request but rejects some of its spans says so in its reply.
func TestOTLPReportsRejectedSpans(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{
			RejectedSpans: 3, ErrorMessage: "span too large"}})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	cl := testExporter(t, Config{Endpoint: srv.URL}, env())
	if err := cl.ExportSpans(context.Background(), spans("a")); err == nil || !strings.Contains(err.Error(), "rejected 3 spans: span too large") {
		t.Fatalf("err %v", err)
	}
	// A 200 whose body is not that message reports nothing: the spans were taken.
	for _, body := range [][]byte{{0xff, 0xff}, {0x0a, 0x05, 0x08}} {
		if err := partialSuccess(body, "application/x-protobuf"); err != nil {
			t.Errorf("%x: %v", body, err)
		}
	}
}

// Stop ends an upload still waiting on a collector that does not answer.
func TestOTLPStopEndsAHangingUpload(t *testing.T) {
	t.Parallel()
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	cl := testExporter(t, Config{Endpoint: srv.URL}, env())
	done := make(chan error, 1)
	go func() { done <- cl.ExportSpans(context.Background(), spans("a")) }()
	<-arrived // the post is in flight
	if err := cl.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a stopped upload reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upload went on after Stop")
	}
}

// An https collector is trusted through OTEL_EXPORTER_OTLP_CERTIFICATE; without it, its
// private CA is refused.
func TestOTLPTrustsTheCertificateOfTheVariable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	trusted := testExporter(t, Config{Endpoint: srv.URL}, env("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", ca))
	if err := trusted.ExportSpans(context.Background(), spans("a")); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	untrusted := testExporter(t, Config{Endpoint: srv.URL}, env())
	if err := untrusted.ExportSpans(context.Background(), spans("a")); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
}

// The endpoint: Config.Endpoint (a base URL) wins; else the per-signal variable, as is;
// else the SDK's default.
func TestOTLPEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    Config
		env  func(string) string
		want string
	}{
		{Config{Endpoint: "http://collector:4318/otlp/"}, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:4318/x"), "http://collector:4318/otlp/v1/traces"},
		{Config{Exporter: ExporterOTLP}, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://other:4318/x"), "https://other:4318/x"},
		{Config{Exporter: ExporterOTLP}, env(), defaultEndpoint},
	} {
		if cl := testExporter(t, tc.c, tc.env); cl.url != tc.want {
			t.Errorf("%+v: %s, want %s", tc.c, cl.url, tc.want)
		}
	}
}

// A variable the exporter cannot use stops New with its name (DESIGN §6: a setting's
// error names it); a header's value, which may be a secret, is not repeated.
func TestOTLPBadVariableNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "10s"},
		{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "-5"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "api-key"},
		{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=%zzsecret"},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"},
		{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/nonexistent/cert.pem"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/thrift"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://user:pw@collector:4318"},
	} {
		_, err := newWithEnv(context.Background(), Config{Exporter: ExporterOTLP}, env(tc.name, tc.value))
		if err == nil || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: %v; want an error naming it", tc.name, tc.value, err)
		}
		if err != nil && (strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "pw@")) {
			t.Errorf("%s: the error repeats a secret: %v", tc.name, err)
		}
	}
}
