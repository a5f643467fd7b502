package web_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/web"
)

// With TraceURLTemplate set, the issue timeline links a traced entry to its trace; an
// untraced one gets no link, and without the template nothing links.
func TestIssueTimelineLinksToTheTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	sc, _ := event.ParseTraceParent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-9"}}`))
	msg, err := event.New(event.TriageRequested, "RHEL-9", task, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pub.PublishID(trace.ContextWithSpanContext(context.Background(), sc), e.topo.Stream("triage", "", false), msg); err != nil {
		t.Fatal(err)
	}
	e.publish("RHEL-9") // untraced
	_, plain := e.get("/issue?key=RHEL-9")
	if strings.Contains(plain, "/trace/") {
		t.Fatalf("a link without TraceURLTemplate:\n%s", plain)
	}

	srv, err := web.New(web.Config{Inspector: e.in, Topology: e.topo, Redactor: redact.New(secret),
		TraceURLTemplate: "https://jaeger.example.com/trace/{trace_id}"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	e.ts = ts
	_, body := e.get("/issue?key=RHEL-9")
	want := `href="https://jaeger.example.com/trace/0af7651916cd43dd8448eb211c80319c"`
	if strings.Count(body, want) != 1 || strings.Count(body, "/trace/") != 1 {
		t.Fatalf("want one link %s (the traced entry's only):\n%s", want, body)
	}

	for _, bad := range []string{"jaeger/trace/{trace_id}", "https://jaeger.example.com/trace/", "javascript:alert(1)//{trace_id}"} {
		if _, err := web.New(web.Config{Inspector: e.in, TraceURLTemplate: bad}); !errors.Is(err, web.ErrTraceURLTemplate) {
			t.Errorf("TraceURLTemplate %q: %v, want ErrTraceURLTemplate", bad, err)
		}
	}
}
