package handlers_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/tracing"
	"github.com/ymirflow/ymirflow/runners"
	"github.com/ymirflow/ymirflow/runners/demorunner"
)

// spanIndex finds exported spans by name.
type spanIndex []tracetest.SpanStub

func (s spanIndex) named(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, sp := range s {
		if sp.Name == name {
			found = append(found, sp)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1; spans: %v", len(found), name, s.names())
	}
	return found[0]
}

func (s spanIndex) names() []string {
	var out []string
	for _, sp := range s {
		out = append(out, sp.Name)
	}
	return out
}

func (s spanIndex) has(name string) bool {
	for _, sp := range s {
		if sp.Name == name {
			return true
		}
	}
	return false
}

func attrOf(sp tracetest.SpanStub, key string) string {
	for _, kv := range sp.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func hasEvent(sp tracetest.SpanStub, name string) bool {
	for _, ev := range sp.Events {
		if ev.Name == name {
			return true
		}
	}
	return false
}

// wantChild fails unless child's parent is parent, in parent's trace.
func wantChild(t *testing.T, parent, child tracetest.SpanStub) {
	t.Helper()
	if child.SpanContext.TraceID() != parent.SpanContext.TraceID() || child.Parent.SpanID() != parent.SpanContext.SpanID() {
		t.Fatalf("span %q (trace %s, parent %s) is not a child of %q (trace %s, span %s)", child.Name,
			child.SpanContext.TraceID(), child.Parent.SpanID(), parent.Name, parent.SpanContext.TraceID(), parent.SpanContext.SpanID())
	}
}

// One triage run that dispatches to backport is one trace, in the SDK's in-memory
// exporter, from the publish to the backport's outcome record: publish → triage
// delivery (lease acquired) → runner, Jira writes → downstream publish → backport
// delivery → runner (an exec agent that sees TRACEPARENT) → Jira write → outcome record.
func TestOneTraceFromPublishToBackportOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-300", Labels: []string{"cve"}})
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewProvider(tracing.Config{Command: "test"}, sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	pub := event.NewPublisher(e.rdb, 0).WithTracerProvider(tp)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := filepath.Join(t.TempDir(), "traceparent")
	agent := runners.ExecRunner{Command: `printf '%s' "$TRACEPARENT" > ` + seen + `; echo '{"success":true,"merge_request_url":"https://mr/300"}'`}
	triage := demorunner.Runner{Seed: 1, Duration: time.Millisecond, Mix: map[string]int{runners.ResolutionBackport: 1}, Branches: []string{"c9s"}}
	traced := func(c *handlers.Config) { c.TracerProvider, c.Publisher = tp, pub }
	for _, st := range []struct{ agent, branch string }{{"triage", ""}, {"backport", "c9s"}} {
		var r runners.Runner = triage
		if st.agent == "backport" {
			r = agent
		}
		cfg := e.Config(st.agent, st.branch, "w-"+st.agent, e.locker(), e.handler(st.agent, st.branch, r, traced))
		cfg.Logger, cfg.TracerProvider = e.log, tp
		e.Start(ctx, cfg)
	}

	msg := triageMsg(t, "RHEL-300", false, "")
	if _, err := pub.PublishID(context.Background(), e.topo.Stream("triage", "", false), msg); err != nil {
		t.Fatal(err)
	}
	backport := "process " + e.topo.Stream("backport", "c9s", false)
	redistest.Eventually(t, 20*time.Second, func() bool { return spanIndex(exp.GetSpans()).has(backport) },
		"the backport delivery's span ended (spans %v)", spanIndex(exp.GetSpans()).names())

	spans := spanIndex(exp.GetSpans())
	triageStream, backportStream := e.topo.Stream("triage", "", false), e.topo.Stream("backport", "c9s", false)
	pubTriage := spans.named(t, "publish "+triageStream)
	procTriage := spans.named(t, "process "+triageStream)
	runTriage := spans.named(t, "runner triage")
	pubBackport := spans.named(t, "publish "+backportStream)
	procBackport := spans.named(t, backport)
	runBackport := spans.named(t, "runner backport")
	if pubTriage.Parent.IsValid() {
		t.Fatalf("the first publish has a parent %s: the trace starts there", pubTriage.Parent.SpanID())
	}
	wantChild(t, pubTriage, procTriage)
	wantChild(t, procTriage, runTriage)
	wantChild(t, procTriage, pubBackport)
	wantChild(t, pubBackport, procBackport)
	wantChild(t, procBackport, runBackport)
	checkRecordAndJiraSpans(t, spans, pubTriage, procTriage, procBackport)
	checkDeliverySpans(t, procTriage, procBackport)

	// The entries carry the traceparent; the agent saw its runner span's.
	for _, stream := range []string{triageStream, backportStream} {
		entries := e.entries(stream)
		if len(entries) != 1 || entries[0].Values["m:"+event.MetaTraceParent] == nil {
			t.Fatalf("%s entries %v: no traceparent", stream, entries)
		}
	}
	got, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	if want := event.FormatTraceParent(runBackport.SpanContext); string(got) != want {
		t.Fatalf("the agent saw TRACEPARENT=%q, want its runner span's %q", got, want)
	}
	// The outcome record names its trace, for the console's link.
	recs := e.recordsOf("RHEL-300", "backport")
	if len(recs) != 1 || recs[0]["trace_id"] != pubTriage.SpanContext.TraceID().String() {
		t.Fatalf("backport records %v: want trace_id %s", recs, pubTriage.SpanContext.TraceID())
	}
	if procBackport.SpanKind != trace.SpanKindConsumer || pubBackport.SpanKind != trace.SpanKindProducer {
		t.Fatalf("span kinds: process %v, publish %v", procBackport.SpanKind, pubBackport.SpanKind)
	}
}

// checkRecordAndJiraSpans: the backport's outcome record is a child of its delivery,
// the Jira writes (at least two) are fenced children of the deliveries, and every span
// is in the trace of the first publish.
func checkRecordAndJiraSpans(t *testing.T, spans spanIndex, pubTriage, procTriage, procBackport tracetest.SpanStub) {
	t.Helper()
	// Two outcome records (triage's and backport's) share a name: the backport's is
	// the child of the backport delivery.
	var backportRecord bool
	for _, sp := range spans {
		if sp.Name == "record "+event.StageDone && sp.Parent.SpanID() == procBackport.SpanContext.SpanID() {
			backportRecord = true
		}
	}
	if !backportRecord {
		t.Fatalf("no outcome record span under the backport delivery")
	}
	var jiraWrites int
	for _, sp := range spans {
		if sp.Name == "jira labels" {
			jiraWrites++
			if attrOf(sp, "ymirflow.fenced") != "true" {
				t.Fatalf("jira write span not fenced: %v", sp.Attributes)
			}
			if p := sp.Parent.SpanID(); p != procTriage.SpanContext.SpanID() && p != procBackport.SpanContext.SpanID() {
				t.Fatalf("jira write span outside the deliveries")
			}
		}
	}
	if jiraWrites < 2 {
		t.Fatalf("%d jira write spans, want the triage's and the backport's", jiraWrites)
	}
	for _, sp := range spans {
		if sp.SpanContext.TraceID() != pubTriage.SpanContext.TraceID() {
			t.Fatalf("span %q is in trace %s, not the run's %s", sp.Name, sp.SpanContext.TraceID(), pubTriage.SpanContext.TraceID())
		}
	}
}

// checkDeliverySpans: the delivery spans carry the issue run's identity, and the lease's
// outcome.
func checkDeliverySpans(t *testing.T, procTriage, procBackport tracetest.SpanStub) {
	t.Helper()
	// The delivery spans carry the issue run's identity, and the lease's outcome.
	for _, sp := range []tracetest.SpanStub{procTriage, procBackport} {
		for _, k := range []string{"ymirflow.issue_key", "ymirflow.agent", "ymirflow.fence", "ymirflow.stream_id", "ymirflow.attempt", "ymirflow.consumer"} {
			if attrOf(sp, k) == "" {
				t.Fatalf("span %q lacks %s: %v", sp.Name, k, sp.Attributes)
			}
		}
		if attrOf(sp, "ymirflow.issue_key") != "RHEL-300" || !hasEvent(sp, "lease.acquired") {
			t.Fatalf("span %q: attributes %v, events %v", sp.Name, sp.Attributes, sp.Events)
		}
	}
	if attrOf(procBackport, "ymirflow.branch") != "c9s" || attrOf(procBackport, "ymirflow.agent") != "backport" {
		t.Fatalf("backport span attributes %v", procBackport.Attributes)
	}
}
