package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// The built binary's spans reach a collector through its own OTLP/HTTP transport, with
// the exporter's standard variables applied: `enqueue` publishes one request traced
// and, as it exits, flushes its span to the collector.
func TestEnqueueSendsItsSpanToTheCollector(t *testing.T) {
	_, ns := redistest.Client(t)
	type export struct {
		auth string
		req  *coltracepb.ExportTraceServiceRequest
	}
	got := make(chan export, 8)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			z, err := gzip.NewReader(r.Body)
			if err != nil {
				t.Errorf("gzip: %v", err)
				return
			}
			body = z
		}
		b, _ := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			t.Errorf("the collector cannot read %s %s (%d bytes)", r.Method, r.URL.Path, len(b))
		}
		got <- export{auth: r.Header.Get("Authorization"), req: &req}
	}))
	defer collector.Close()
	env := []string{"REDIS_URL=" + redistest.URL(), "OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL,
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS=Authorization=Bearer%20collector-token", "OTEL_EXPORTER_OTLP_COMPRESSION=gzip"}
	p := startProc(t, buildBinary(t), env, "enqueue", "--ymir-namespace", strings.TrimSuffix(ns, ":"), "RHEL-7")
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s", code, p.stderr())
	}
	select {
	case e := <-got:
		if e.auth != "Bearer collector-token" {
			t.Errorf("Authorization %q: want the header of OTEL_EXPORTER_OTLP_TRACES_HEADERS", e.auth)
		}
		rs := e.req.GetResourceSpans()
		if len(rs) == 0 || len(rs[0].GetScopeSpans()) == 0 || len(rs[0].GetScopeSpans()[0].GetSpans()) == 0 {
			t.Fatalf("no span in %v", e.req)
		}
		attrs := map[string]string{}
		for _, kv := range rs[0].GetResource().GetAttributes() {
			attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		if attrs["service.name"] != "ymirflow" || attrs["ymirflow.command"] != "enqueue" {
			t.Errorf("resource %v: want service.name ymirflow, ymirflow.command enqueue", attrs)
		}
	default:
		t.Fatalf("enqueue exited and no span reached the collector\n%s", p.stderr())
	}
}

// An exporter variable the command cannot use stops it at start, a usage error naming
// the variable, before anything is published.
func TestBadExporterVariableStopsTheCommandAtStart(t *testing.T) {
	rdb, ns := redistest.Client(t)
	env := []string{"REDIS_URL=" + redistest.URL(), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318",
		"OTEL_EXPORTER_OTLP_TIMEOUT=10s"}
	p := startProc(t, buildBinary(t), env, "enqueue", "--ymir-namespace", strings.TrimSuffix(ns, ":"), "RHEL-7")
	if code := p.exit(30 * time.Second); code != exitUsage || !strings.Contains(p.stderr(), `OTEL_EXPORTER_OTLP_TIMEOUT="10s"`) {
		t.Fatalf("exit %d, want %d naming OTEL_EXPORTER_OTLP_TIMEOUT:\n%s", code, exitUsage, p.stderr())
	}
	if keys, _ := rdb.Keys(context.Background(), "*"+ns+"*").Result(); len(keys) > 0 {
		t.Fatalf("published before stopping: %v", keys)
	}
}

// A collector that refuses the spans: the failure is in the command's own log (a JSON
// line at LOG_FORMAT=json, with the collector's answer), not a bare line of OpenTelemetry's
// default handler.
func TestRefusedExportIsInTheCommandsLog(t *testing.T) {
	_, ns := redistest.Client(t)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unknown tenant", http.StatusBadRequest)
	}))
	defer collector.Close()
	env := []string{"REDIS_URL=" + redistest.URL(), "OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "LOG_FORMAT=json"}
	p := startProc(t, buildBinary(t), env, "enqueue", "--ymir-namespace", strings.TrimSuffix(ns, ":"), "RHEL-7")
	if code := p.exit(30 * time.Second); code != 0 {
		t.Fatalf("enqueue: exit %d\n%s", code, p.stderr())
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(p.stderr()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a line of stderr is not JSON: %q", line)
		}
		if rec["message"] == "tracing: spans not exported" && strings.Contains(fmt.Sprint(rec["error"]), "400 Bad Request: unknown tenant") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no log record of the refused export:\n%s", p.stderr())
	}
}
