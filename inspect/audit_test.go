package inspect_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/drainreq"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// inspectorReads are the Inspector's methods that only read; inspectorWrites those that
// write, with a call of each. A method in neither list fails TestEveryWriteIsAudited: a
// new method must be put in one, and a write gets the audited path.
var inspectorReads = []string{"Audit", "AuditLog", "CanonicalKey", "Cost", "DeadIssues", "DeadLetter", "DeadLetters", "DrainProgress", "Drains", "History", "Lease", "Locks",
	"NewestDeadLetters", "Outcomes", "ParkedPerStream", "ParsePause", "PauseScope", "Pauses", "Pending", "Running", "Slots", "Streams", "Timeline", "Workers"}

type writeCall struct {
	name string
	// call runs the write; effect says whether it changed the pipeline.
	call   func(context.Context, *inspect.Inspector) error
	effect func() bool
}

// TestEveryWriteIsAudited enumerates the Inspector's exported methods: each write is
// refused without an operator (audit.ErrNoActor), is not done when its audit record
// cannot be appended (the audit stream made the wrong type: audit.ErrNotRecorded, and
// the pipeline is unchanged), and is recorded with who, why and its scope when done.
func TestEveryWriteIsAudited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 0)
	held := func() bool { _, err := in.Lease(ctx, "triage", "RHEL-1"); return err == nil }
	deadN := func() int64 { return e.Client.XLen(ctx, e.Topology.Dead()).Val() }
	triageN := func() int64 { return e.Client.XLen(ctx, e.TriageStream()).Val() }
	var dead string
	setup := func() {
		t.Helper()
		e.Client.Del(ctx, e.Topology.Dead(), e.Topology.Audit())
		if !held() {
			if _, err := e.TriageLocker(time.Minute).Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{Owner: "w"}); err != nil {
				t.Fatal(err)
			}
		}
		orig := e.PublishTriage("RHEL-1")
		dead = e.bury(e.TriageStream(), orig, "RHEL-1", "boom")
	}
	paused := func() bool { ps, _ := in.Pauses(ctx); return len(ps) == 1 }
	var before, deadBefore int64
	mark := func() { before, deadBefore = triageN(), deadN() }
	writes := []writeCall{
		{"ForceRelease", func(c context.Context, in *inspect.Inspector) error {
			_, err := in.ForceRelease(c, "triage", "RHEL-1")
			return err
		}, func() bool { return !held() }},
		{"Replay", func(c context.Context, in *inspect.Inspector) error {
			_, err := in.Replay(c, inspect.ReplayOptions{Stream: "triage", Issue: "RHEL-1"})
			return err
		}, func() bool { return triageN() > before }},
		{"Requeue", func(c context.Context, in *inspect.Inspector) error { _, err := in.Requeue(c, dead); return err }, func() bool { return deadN() < deadBefore }},
		{"RequeueAll", func(c context.Context, in *inspect.Inspector) error { _, err := in.RequeueAll(c, "RHEL-1"); return err }, func() bool { return deadN() < deadBefore }},
		{"Purge", func(c context.Context, in *inspect.Inspector) error { _, err := in.Purge(c, ""); return err }, func() bool { return deadN() < deadBefore }},
		{"Delete", func(c context.Context, in *inspect.Inspector) error { _, err := in.Delete(c, dead); return err }, func() bool { return deadN() < deadBefore }},
		{"Drain", func(c context.Context, in *inspect.Inspector) error {
			e.Client.Del(c, e.Topology.Drains())
			return in.Drain(c, drainreq.Target{Agent: "triage"})
		}, func() bool { return e.Client.HLen(ctx, e.Topology.Drains()).Val() == 1 }},
		{"Undrain", func(c context.Context, in *inspect.Inspector) error {
			e.Client.Del(c, e.Topology.Drains())
			e.Client.HSet(c, e.Topology.Drains(), "all", "{}")
			return in.Undrain(c, drainreq.Target{All: true})
		}, func() bool { return e.Client.HLen(ctx, e.Topology.Drains()).Val() == 0 }},
		{"Pause", func(c context.Context, in *inspect.Inspector) error {
			_, err := in.Pause(c, "issue:rhel-1", false)
			return err
		}, func() bool { return paused() }},
		{"Resume", func(c context.Context, in *inspect.Inspector) error {
			if _, err := e.TriageLocker(time.Minute).Pauses().Set(ctx, lease.Pause{Scope: "issue:RHEL-1", Reason: "setup"}); err != nil {
				return err
			}
			_, err := in.Resume(c, "issue:RHEL-1")
			return err
		}, func() bool { return !paused() }},
	}
	typ := reflect.TypeOf(in)
	for i := range typ.NumMethod() {
		name := typ.Method(i).Name
		if !slices.Contains(inspectorReads, name) && !slices.ContainsFunc(writes, func(w writeCall) bool { return w.name == name }) {
			t.Errorf("Inspector.%s is neither a read nor an audited write: add it to inspectorReads or to the writes of this test", name)
		}
	}
	op := audit.Operator{Who: "alice@host", From: "cli host", Reason: "the test says so"}
	for _, w := range writes {
		setup()
		mark()
		if err := w.call(ctx, in); !errors.Is(err, audit.ErrNoActor) || w.effect() {
			t.Errorf("%s without an operator: %v, effect %v; want audit.ErrNoActor and no effect", w.name, err, w.effect())
		}
		if err := w.call(audit.WithOperator(ctx, audit.Operator{Who: "alice"}), in); !errors.Is(err, audit.ErrNoReason) || w.effect() {
			t.Errorf("%s without a reason: %v; want audit.ErrNoReason and no effect", w.name, err)
		}
		if err := e.Client.Set(ctx, e.Topology.Audit(), "wrong type", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := w.call(audit.WithOperator(ctx, op), in); !errors.Is(err, audit.ErrNotRecorded) || w.effect() {
			t.Errorf("%s with a broken audit stream: %v, effect %v; want audit.ErrNotRecorded and no effect", w.name, err, w.effect())
		}
		e.Client.Del(ctx, e.Topology.Audit())
		if err := w.call(audit.WithOperator(ctx, op), in); err != nil || !w.effect() {
			t.Errorf("%s: %v, effect %v", w.name, err, w.effect())
		}
		recs, err := in.Audit(ctx, audit.Filter{})
		if err != nil || len(recs) != 1 || recs[0].Who != op.Who || recs[0].Reason != op.Reason || recs[0].Scope == "" ||
			recs[0].Outcome != audit.OutcomeDone {
			t.Errorf("%s: audit %+v, %v", w.name, recs, err)
		}
	}
}

// TestHistoryShowsOperatorActions: an issue's history lists the writes on it.
func TestHistoryShowsOperatorActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 0)
	e.PublishTriage("RHEL-4")
	if _, err := in.ForceRelease(audit.WithOperator(ctx, audit.Operator{Who: "bob", From: "console 10.0.0.1", Reason: "stuck"}), "triage", "rhel-4"); err != nil {
		t.Fatal(err)
	}
	rep, err := in.Timeline(ctx, "RHEL-4")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, ev := range rep.Events {
		kinds = append(kinds, ev.Kind+" "+ev.EventType+" "+ev.Reason)
	}
	want := []string{"input triage.requested ", "audit operator.release started", "audit operator.release done"}
	if !slices.Equal(kinds, want) || rep.Scanned != nil {
		t.Fatalf("history = %q (scanned %v), want %q", kinds, rep.Scanned, want)
	}
	if d := rep.Events[1].Detail; d != "started by bob from console 10.0.0.1: agent=triage issue=RHEL-4; why: stuck" {
		t.Fatalf("detail = %q", d)
	}
}
