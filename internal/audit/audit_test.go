package audit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

func newLog(t *testing.T) (*audit.Log, func() int64) {
	t.Helper()
	rdb, ns := redistest.Client(t)
	l, err := audit.New(audit.Config{Client: rdb, Stream: ns + "ymir:audit"})
	if err != nil {
		t.Fatal(err)
	}
	return l, func() int64 { return rdb.XLen(context.Background(), l.Stream()).Val() }
}

var entry = audit.Entry{Who: "alice@host", From: "cli host", Action: "release", Scope: "agent=triage issue=RHEL-7",
	Issues: []string{"RHEL-7"}, Reason: "stuck run"}

// TestDoRecordsBeforeTheWrite: the started record is in the stream when the write runs,
// and its end follows; List shows one write with the end's outcome.
func TestDoRecordsBeforeTheWrite(t *testing.T) {
	t.Parallel()
	l, n := newLog(t)
	ctx := context.Background()
	var during int64
	if err := l.Do(ctx, entry, func(context.Context) error { during = n(); return nil }); err != nil {
		t.Fatal(err)
	}
	if during != 1 || n() != 2 {
		t.Fatalf("records during the write %d (want 1), after %d (want 2)", during, n())
	}
	boom := errors.New("boom")
	e2 := entry
	e2.Action, e2.Who, e2.Issues = "purge", "bob@host", nil
	if err := l.Do(ctx, e2, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	all, err := l.List(ctx, audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Action != "purge" || all[0].Outcome != audit.OutcomeFailed || all[0].Detail != "boom" ||
		all[1].Outcome != audit.OutcomeDone || all[1].Who != "alice@host" || all[1].Reason != "stuck run" || all[1].Time.IsZero() {
		t.Fatalf("List = %+v", all)
	}
	for _, f := range []audit.Filter{{Who: "alice@host"}, {Action: "release"}, {Issue: "RHEL-7"}, {Since: all[1].Time}} {
		got, err := l.List(ctx, f)
		if err != nil || len(got) < 1 || got[len(got)-1].ID != all[1].ID {
			t.Fatalf("List(%+v) = %+v, %v", f, got, err)
		}
	}
	if got, _ := l.List(ctx, audit.Filter{Issue: "RHEL-8"}); len(got) != 0 {
		t.Fatalf("List(other issue) = %+v", got)
	}
	if got, _ := l.List(ctx, audit.Filter{Since: time.Now().Add(time.Hour)}); len(got) != 0 {
		t.Fatalf("List(future) = %+v", got)
	}
}

// TestDoRefusesWithoutReasonOrActor: nothing runs, nothing is recorded.
func TestDoRefusesWithoutReasonOrActor(t *testing.T) {
	t.Parallel()
	l, n := newLog(t)
	for _, c := range []struct {
		e    audit.Entry
		want error
	}{{audit.Entry{Who: "a", Action: "x", Reason: " "}, audit.ErrNoReason}, {audit.Entry{Action: "x", Reason: "r"}, audit.ErrNoActor}} {
		ran := false
		if err := l.Do(context.Background(), c.e, func(context.Context) error { ran = true; return nil }); !errors.Is(err, c.want) || ran {
			t.Fatalf("Do(%+v) = %v, ran %v; want %v and not run", c.e, err, ran, c.want)
		}
	}
	if n() != 0 {
		t.Fatalf("%d records, want none", n())
	}
}

// TestDoDoesNotWriteWhenTheRecordFails: the audit stream made the wrong type (a fault):
// the write does not run.
func TestDoDoesNotWriteWhenTheRecordFails(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l, _ := audit.New(audit.Config{Client: rdb, Stream: ns + "ymir:audit"})
	if err := rdb.Set(context.Background(), l.Stream(), "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ran := false
	err := l.Do(context.Background(), entry, func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, audit.ErrNotRecorded) || ran {
		t.Fatalf("Do = %v, ran %v; want ErrNotRecorded and not run", err, ran)
	}
}

// TestRecordsAreIndexedByIssue: each issue a record names finds it in its index, in the
// form inspect's history reads.
func TestRecordsAreIndexedByIssue(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l, _ := audit.New(audit.Config{Client: rdb, Stream: ns + "ymir:audit"})
	e := entry
	e.Issues = []string{"RHEL-1", "RHEL-2", "RHEL-1"}
	if err := l.Refused(context.Background(), e, "viewer"); err != nil {
		t.Fatal(err)
	}
	for _, is := range []string{"RHEL-1", "RHEL-2"} {
		ids := rdb.ZRange(context.Background(), xonce.IndexKey(l.Stream(), is), 0, -1).Val()
		if len(ids) != 1 {
			t.Fatalf("index of %s = %v", is, ids)
		}
	}
	if rdb.Exists(context.Background(), xonce.IndexSinceKey(l.Stream())).Val() != 1 {
		t.Fatal("index-since not set")
	}
	got, _ := l.List(context.Background(), audit.Filter{})
	if len(got) != 1 || got[0].Outcome != audit.OutcomeRefused || got[0].Detail != "viewer" {
		t.Fatalf("List = %+v", got)
	}
}
