package webhook

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// A traced webhook delivery is the root of the issue run's trace: the fetcher's batch
// and its publish are its children, and the entry carries the publish's traceparent.
func TestTracedDeliveryIsTheRunsRoot(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")},
		withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }),
		withConfig(func(c *Config) {
			f, err := fetcher.New(fetcher.Config{Jira: c.Jira, Redis: c.Redis, Topology: c.Topology, JQL: jqlTest,
				TriggerGroup: group, TracerProvider: tp})
			if err != nil {
				t.Fatal(err)
			}
			c.Fetcher, c.TracerProvider = f, tp
		}))
	e.jira.ChangeLabels("RHEL-1", maintainer, []string{labels.Todo}, nil)
	body := e.event("RHEL-1", maintainer, labels.Todo)
	if st, _ := e.post(body, signed(body, "d-1")); st != 202 {
		t.Fatalf("delivery answered %d", st)
	}
	e.drain(30 * time.Second)
	spans := map[string]tracetest.SpanStub{}
	for _, sp := range exp.GetSpans() {
		spans[sp.Name] = sp
	}
	delivery, batch := spans["webhook delivery"], spans["fetch process"]
	publish := spans["publish "+e.topo.Stream("triage", "", true)]
	if !delivery.SpanContext.IsValid() || !batch.SpanContext.IsValid() || !publish.SpanContext.IsValid() {
		t.Fatalf("spans %v: want the delivery's, the batch's and the publish's", exp.GetSpans())
	}
	if delivery.Parent.IsValid() || batch.Parent.SpanID() != delivery.SpanContext.SpanID() || publish.Parent.SpanID() != batch.SpanContext.SpanID() {
		t.Fatal("want webhook delivery → fetch process → publish")
	}
	xs, err := e.rdb.XRange(e.ctx, e.topo.Stream("triage", "", true), "-", "+").Result()
	if err != nil || len(xs) != 1 || xs[0].Values["m:"+event.MetaTraceParent] != event.FormatTraceParent(publish.SpanContext) {
		t.Fatalf("entries %v (%v): want the publish span's traceparent", xs, err)
	}
}
