package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/tracing/collectortest"
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
		req, err := collectortest.Decode(r)
		if r.URL.Path != "/v1/traces" || err != nil {
			t.Errorf("%s %s: %v", r.Method, r.URL.Path, err)
			return
		}
		got <- export{auth: r.Header.Get("Authorization"), req: req}
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
		attrs := collectortest.Resource(rs[0])
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

// A worker whose collector hangs goes on consuming, past many export rounds and upload
// timeouts, and stops within its budget: each upload ends at OTEL_EXPORTER_OTLP_TIMEOUT
// (300 ms here) with a warning in the log, and the exporter's Stop ends the last one.
// The worker runs ≈ 3 s, ten times the upload timeout and thirty export rounds
// (OTEL_BSP_SCHEDULE_DELAY 100 ms, read by the SDK); the retry budget (a minute) is
// bounded by the upload timeout.
func TestWorkerGoesOnPastAHangingCollector(t *testing.T) {
	rdb, ns := redistest.Client(t)
	var posts atomic.Int64
	hang := make(chan struct{})
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer collector.Close()
	defer close(hang)
	topo := event.Topology{Namespace: ns + "ymir"}
	env := []string{"REDIS_URL=" + redistest.URL(), "YMIR_NAMESPACE=" + topo.Namespace, "BLOCK_TIME=200ms",
		"METRICS_ADDR=", "DEMO_DURATION=0s", "OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL,
		"OTEL_EXPORTER_OTLP_TIMEOUT=300", "OTEL_BSP_SCHEDULE_DELAY=100"}
	w := startProc(t, buildBinary(t), env, "worker", "--agent", "triage", "--runner", "demo")
	w.waitLine(true, 30*time.Second, func(l string) bool { return strings.Contains(l, `"worker starting"`) })
	stream := topo.Stream("triage", "", false)
	ctx := context.Background()
	start := time.Now()
	for i := 1; time.Since(start) < 3*time.Second; i++ {
		key := "RHEL-" + strconv.Itoa(i)
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
		msg, err := event.New(event.TriageRequested, key, task, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)}).Val()
		// Each event is consumed in turn, however the exports fare.
		redistest.Eventually(t, 10*time.Second, func() bool { return acked(ctx, rdb, stream, id) },
			"%s (%s) not consumed %v after the worker started; stderr:\n%s", key, id, time.Since(start), w.stderr())
		time.Sleep(100 * time.Millisecond) // events spread over the run, one per export round
	}
	if posts.Load() < 2 {
		t.Fatalf("%d uploads reached the collector in 3 s: the exports did not run", posts.Load())
	}
	if !strings.Contains(w.stderr(), "tracing: spans not exported") {
		t.Fatalf("no warning of a timed-out upload:\n%s", w.stderr())
	}
	if code, took := w.stop(15 * time.Second); code != 0 {
		t.Fatalf("worker: exit %d %v after SIGINT\n%s", code, took, w.stderr())
	}
}

// acked reports whether the triage group has read entry id and holds none pending.
func acked(ctx context.Context, rdb *redis.Client, stream, id string) bool {
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil || len(groups) == 0 {
		return false
	}
	for _, g := range groups {
		if g.Name == "triage" {
			return g.Pending == 0 && streamid.Compare(g.LastDeliveredID, id) >= 0
		}
	}
	return false
}
