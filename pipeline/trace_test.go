package pipeline_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// workerTracing is the worker process's TracerProvider: with W_TRACE set, an SDK that
// records (its spans die with the process, as a SIGKILLed worker's batch does).
func workerTracing() trace.TracerProvider {
	if os.Getenv("W_TRACE") == "" {
		return nil
	}
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
}

// deliveryTraceParent is the traceparent of the span a handler runs under, "-" without.
func deliveryTraceParent(msg *message.Message) string {
	if tp := event.FormatTraceParent(trace.SpanContextFromContext(msg.Context())); tp != "" {
		return tp
	}
	return "-"
}

func newTraced(t *testing.T) (*tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return exp, tp
}

func spansNamed(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range exp.GetSpans() {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func linksTo(sp tracetest.SpanStub, sc trace.SpanContext) bool {
	for _, l := range sp.Links {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

func spanAttr(sp tracetest.SpanStub, key string) string {
	for _, kv := range sp.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// publishTraced publishes a triage request for key through a traced publisher and
// returns the publish span's context.
func publishTraced(t *testing.T, e *env, tp trace.TracerProvider, exp *tracetest.InMemoryExporter, key string) trace.SpanContext {
	t.Helper()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.NewPublisher(e.rdb, 0).WithTracerProvider(tp).PublishID(context.Background(), e.triage(), msg); err != nil {
		t.Fatal(err)
	}
	pubs := spansNamed(exp, "publish "+e.triage())
	return pubs[len(pubs)-1].SpanContext
}

// tracedTriage starts a traced triage router (Config's fast settings) with handler h.
func tracedTriage(ctx context.Context, e *env, consumer string, ttl, maxIdle time.Duration, tp trace.TracerProvider, red *redact.Redactor, h message.NoPublishHandlerFunc) {
	cfg := e.Config("triage", "", consumer, e.TriageLocker(ttl), h)
	cfg.BlockTime, cfg.TracerProvider, cfg.Redactor = 200*time.Millisecond, tp, red
	if maxIdle != 0 {
		cfg.MaxIdleTime = maxIdle
	}
	e.Start(ctx, cfg)
}

// A worker killed with SIGKILL mid-handler: the redelivery's span continues the
// event's trace (a child of the publish, like the first attempt's) and links to the
// first attempt's span, which the killed worker never ended.
func TestRedeliveryAfterSIGKILLContinuesTheTraceLinkedToTheFirstAttempt(t *testing.T) {
	// Not parallel: it runs a worker process and kills it.
	e := newEnv(t)
	exp, tp := newTraced(t)
	ttl, maxIdle, claim := time.Second, 500*time.Millisecond, 100*time.Millisecond
	t.Setenv("W_TRACE", "1")
	a, _ := startWorker(t, workerSpec{ns: e.ns, consumer: "a", ttl: ttl, maxIdle: maxIdle, block: 200 * time.Millisecond, hold: 30 * time.Second, claimInterval: claim})
	published := publishTraced(t, e, tp, exp, "RHEL-70")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(ledgerLines(e, "start")) == 1 }, "a starts")
	first, ok := event.ParseTraceParent(strings.Fields(ledgerLines(e, "start")[0])[5])
	if !ok {
		t.Fatalf("worker a's delivery was not traced: %q", ledgerLines(e, "start"))
	}
	if first.TraceID() != published.TraceID() {
		t.Fatalf("the first attempt's trace %s is not the publish's %s", first.TraceID(), published.TraceID())
	}
	_ = a.Process.Signal(syscall.SIGKILL)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	tracedTriage(ctx, e, "b", ttl, maxIdle, tp, nil, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		return nil
	})
	process := "process " + e.triage()
	redistest.Eventually(t, 15*time.Second, func() bool { return r.Get("RHEL-70") == 1 && len(spansNamed(exp, process)) == 1 },
		"b re-runs it, and its span ends")
	sp := spansNamed(exp, process)[0]
	if sp.SpanContext.TraceID() != published.TraceID() || sp.Parent.SpanID() != published.SpanID() {
		t.Fatalf("the redelivery's span (trace %s, parent %s) does not continue the publish's trace %s (span %s)",
			sp.SpanContext.TraceID(), sp.Parent.SpanID(), published.TraceID(), published.SpanID())
	}
	if !linksTo(sp, first) || spanAttr(sp, "ymirflow.redelivered") != "true" {
		t.Fatalf("the redelivery's span links %v (redelivered=%q), want a link to the first attempt %s", sp.Links,
			spanAttr(sp, "ymirflow.redelivered"), first.SpanID())
	}
}

// A replayed event starts a new trace (the replay's publish is a root) linked to the
// trace the original ran in; the worker's span of the replay is in the new trace and
// carries the link too.
func TestReplayStartsANewTraceLinkedToTheOld(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	exp, tp := newTraced(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	tracedTriage(ctx, e, "w1", 3*time.Second, 0, tp, nil, func(msg *message.Message) error {
		r.Add(issueOf(msg))
		return nil
	})
	original := publishTraced(t, e, tp, exp, "RHEL-71")
	process := "process " + e.triage()
	redistest.Eventually(t, 10*time.Second, func() bool { return len(spansNamed(exp, process)) == 1 }, "the original runs")

	in, err := inspect.New(inspect.Config{Client: e.rdb, Topology: e.Topology, Locker: e.TriageLocker(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	op := audit.WithOperator(ctx, audit.Operator{Who: "tester", Reason: "trace test"}) // writes are audited
	rep, err := in.Replay(op, inspect.ReplayOptions{Stream: e.triage(), Issue: "RHEL-71", TracerProvider: tp})
	if err != nil || len(rep.Events) != 1 {
		t.Fatalf("replay: %v, %+v", err, rep)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return len(spansNamed(exp, process)) == 2 }, "the replay runs")

	pubs := spansNamed(exp, "publish "+e.triage())
	replayPub := pubs[len(pubs)-1]
	if replayPub.Parent.IsValid() || replayPub.SpanContext.TraceID() == original.TraceID() || !linksTo(replayPub, original) {
		t.Fatalf("replay publish: trace %s, parent %v, links %v; want a new root linked to %s", replayPub.SpanContext.TraceID(),
			replayPub.Parent.SpanID(), replayPub.Links, original.SpanID())
	}
	replayed := spansNamed(exp, process)[1]
	if replayed.SpanContext.TraceID() != replayPub.SpanContext.TraceID() || replayed.Parent.SpanID() != replayPub.SpanContext.SpanID() ||
		!linksTo(replayed, original) {
		t.Fatalf("replayed delivery: trace %s parent %s links %v", replayed.SpanContext.TraceID(), replayed.Parent.SpanID(), replayed.Links)
	}
	entries := e.Entries(e.triage())
	last := entries[len(entries)-1].Values
	if last["m:"+event.MetaTraceLink] != event.FormatTraceParent(original) || last["m:"+event.MetaTraceParent] == event.FormatTraceParent(original) {
		t.Fatalf("replayed entry's trace fields: %v", last)
	}
}

// A delivery that fails records the typed cause on its span, dead-lettered at the
// end, and the error text passes the redactor: no secret reaches the exporter.
func TestTracedFailureHasTypedCauseAndNoSecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	exp, tp := newTraced(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const secret = "s3cr3t-jira-token-value"
	tracedTriage(ctx, e, "w1", 3*time.Second, 0, tp, redact.New(secret), func(msg *message.Message) error {
		return errors.New("agent said: token " + secret + " refused")
	})
	e.publishTriage("RHEL-72")
	process := "process " + e.triage()
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 1 && len(spansNamed(exp, process)) == 1 }, "dead-lettered")
	sp := spansNamed(exp, process)[0]
	var dead bool
	for _, ev := range sp.Events {
		if ev.Name == "dead_lettered" {
			dead = true
		}
	}
	if !dead {
		t.Fatalf("no dead_lettered event: %v", sp.Events)
	}
	for _, s := range exp.GetSpans() {
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.String(), secret) {
				t.Fatalf("span %q attribute %s holds the secret", s.Name, kv.Key)
			}
		}
		for _, ev := range s.Events {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), secret) {
					t.Fatalf("span %q event %s holds the secret", s.Name, ev.Name)
				}
			}
		}
		if strings.Contains(s.Status.Description, secret) {
			t.Fatalf("span %q status holds the secret", s.Name)
		}
	}
	// The lease outcome is an event of the same span; a conflict's is lease.dropped.
	var acquired bool
	for _, ev := range sp.Events {
		acquired = acquired || ev.Name == "lease.acquired"
	}
	if !acquired {
		t.Fatalf("no lease.acquired event: %v", sp.Events)
	}
}

// A busy issue's outcome is an event on the busy delivery's span, whatever the policy
// (supersede's, which ends the older run, is TestTracedSupersedeIsAnEventOfTheCancelledRun).
func TestTracedConflictIsASpanEvent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ policy, outcome string }{
		{"drop", "dropped"},
		{"coalesce", "coalesced"},
		{"delay:1m", "delayed"},
		{"deliver", "delivered"},
	} {
		t.Run(c.outcome, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			exp, tp := newTraced(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			locker := e.TriageLocker(3 * time.Second)
			held, err := locker.Acquire(ctx, "triage", "RHEL-73", lease.AcquireOptions{Owner: "other"})
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(context.Background())
			pol, err := lockmw.ParsePolicies(c.policy)
			if err != nil {
				t.Fatal(err)
			}
			cfg := e.Config("triage", "", "w1", locker, func(*message.Message) error { return nil })
			cfg.BlockTime, cfg.TracerProvider, cfg.Policies = 200*time.Millisecond, tp, pol
			e.Start(ctx, cfg)
			e.publishTriage("RHEL-73")
			process := "process " + e.triage()
			redistest.Eventually(t, 10*time.Second, func() bool { return len(spansNamed(exp, process)) == 1 }, "%s", c.outcome)
			sp := spansNamed(exp, process)[0]
			var found bool
			for _, ev := range sp.Events {
				found = found || ev.Name == "lease."+c.outcome
			}
			if !found || spanAttr(sp, "ymirflow.lease.outcome") != c.outcome {
				t.Fatalf("span events %v attributes %v: want lease.%s", sp.Events, sp.Attributes, c.outcome)
			}
		})
	}
}

// Under supersede, the older run that a newer event cancels ends its span with the
// lease.superseded event; the newer event's delivery runs in its own span.
func TestTracedSupersedeIsAnEventOfTheCancelledRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	exp, tp := newTraced(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pol, err := lockmw.ParsePolicies("supersede")
	if err != nil {
		t.Fatal(err)
	}
	var r runs
	h := func(msg *message.Message) error {
		if r.Add(issueOf(msg)) == 1 {
			<-msg.Context().Done() // the first run lasts until a newer event cancels it
			return context.Cause(msg.Context())
		}
		return nil
	}
	cfg := e.Config("triage", "", "w1", e.TriageLocker(3*time.Second), h)
	cfg.BlockTime, cfg.TracerProvider, cfg.Policies = 200*time.Millisecond, tp, pol
	e.Start(ctx, cfg)
	cfg2 := e.Config("triage", "", "w2", e.TriageLocker(3*time.Second), h)
	cfg2.BlockTime, cfg2.TracerProvider, cfg2.Policies = 200*time.Millisecond, tp, pol
	e.Start(ctx, cfg2)
	e.publishTriage("RHEL-74")
	redistest.Eventually(t, 10*time.Second, func() bool { return r.Get("RHEL-74") == 1 }, "the first run starts")
	e.publishTriage("RHEL-74")
	process := "process " + e.triage()
	redistest.Eventually(t, 15*time.Second, func() bool { return r.Get("RHEL-74") == 2 && len(spansNamed(exp, process)) == 2 },
		"the newer event runs and both spans end")
	var superseded int
	for _, sp := range spansNamed(exp, process) {
		for _, ev := range sp.Events {
			if ev.Name == "lease.superseded" {
				superseded++
			}
		}
	}
	if superseded != 1 {
		t.Fatalf("%d spans with lease.superseded, want the cancelled run's: %+v", superseded, spansNamed(exp, process))
	}
}

// A lease lost under the handler is an event of the delivery's span with its typed
// cause, and the span fails with it; the redelivery that re-runs the event is in the
// same trace and links to the lost delivery.
func TestTracedLeaseLossHasItsTypedCause(t *testing.T) {
	// Not parallel: the lease's loss is seen within its heartbeat, timed against a short TTL.
	e := newEnv(t)
	exp, tp := newTraced(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	tracedTriage(ctx, e, "w1", 600*time.Millisecond, 0, tp, nil, func(msg *message.Message) error {
		if r.Add(issueOf(msg)) > 1 {
			return nil
		}
		le, _ := lockmw.LeaseFrom(msg.Context())
		e.rdb.Del(context.Background(), le.Keys().Lock)
		<-msg.Context().Done()
		return msg.Context().Err()
	})
	published := publishTraced(t, e, tp, exp, "RHEL-74")
	process := "process " + e.triage()
	redistest.Eventually(t, 10*time.Second, func() bool { return len(spansNamed(exp, process)) == 2 }, "lost, then re-run")
	lost, rerun := spansNamed(exp, process)[0], spansNamed(exp, process)[1]
	var cause string
	for _, ev := range lost.Events {
		if ev.Name == "lease.lost" {
			for _, kv := range ev.Attributes {
				if kv.Key == event.AttrErrorType {
					cause = kv.Value.AsString()
				}
			}
		}
	}
	if cause != "lease_lost" || spanAttr(lost, string(event.AttrErrorType)) != "lease_lost" || lost.Status.Code != codes.Error {
		t.Fatalf("lost delivery: events %v, attributes %v, status %v; want lease.lost with error.type lease_lost", lost.Events,
			lost.Attributes, lost.Status)
	}
	if rerun.SpanContext.TraceID() != published.TraceID() || !linksTo(rerun, lost.SpanContext) {
		t.Fatalf("re-run: trace %s, links %v; want the publish's trace %s and a link to the lost delivery", rerun.SpanContext.TraceID(),
			rerun.Links, published.TraceID())
	}
}
