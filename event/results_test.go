package event_test

import (
	"context"
	"testing"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// A record named by what it records (AddOnce) is appended once, whoever appends it
// again, and Recorded finds it by that name: with its fields while it is in the stream,
// with its id only once a trim cut it (it was recorded), and not at all once it is gone
// from a stream that was not trimmed past it (a failover lost it), whose name is then
// free for the outcome to be recorded again.
func TestAddOnceAndRecorded(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "results"
	r := event.NewResults(rdb, stream, 0)
	rec := event.Record{EventType: event.StageFailed, Agent: "triage", IssueKey: "RHEL-1", MessageID: "1-1", Detail: `{"error":"boom"}`}
	if _, found, err := r.Recorded(ctx, "outcome-a"); found || err != nil {
		t.Fatalf("before any record: found %v, %v", found, err)
	}
	id, err := r.AddOnce(ctx, rec, "outcome-a")
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.AddOnce(ctx, event.Record{EventType: event.StageDone, IssueKey: "RHEL-1"}, "outcome-a")
	if err != nil || again != id || rdb.XLen(ctx, stream).Val() != 1 {
		t.Fatalf("second AddOnce: %s, %v, %d entries; want %s and one entry", again, err, rdb.XLen(ctx, stream).Val(), id)
	}
	got, found, err := r.Recorded(ctx, "outcome-a")
	if err != nil || !found || got.ID != id || got.EventType != event.StageFailed || got.Detail != rec.Detail {
		t.Fatalf("Recorded: %+v, %v, %v", got, found, err)
	}
	// Trimmed past it: recorded, fields unknown.
	if _, err := r.Add(ctx, event.Record{EventType: event.StageDone, IssueKey: "RHEL-2"}); err != nil {
		t.Fatal(err)
	}
	rdb.XTrimMaxLen(ctx, stream, 1)
	if got, found, err := r.Recorded(ctx, "outcome-a"); err != nil || !found || got.ID != id || got.EventType != "" {
		t.Fatalf("Recorded after a trim: %+v, %v, %v", got, found, err)
	}
	// Lost: a newer record named b is gone while the stream's first entry is older.
	idB, err := r.AddOnce(ctx, rec, "outcome-b")
	if err != nil {
		t.Fatal(err)
	}
	rdb.XDel(ctx, stream, idB)
	if _, found, err := r.Recorded(ctx, "outcome-b"); found || err != nil {
		t.Fatalf("Recorded of a lost record: found %v, %v", found, err)
	}
	if idB2, err := r.AddOnce(ctx, rec, "outcome-b"); err != nil || idB2 == idB {
		t.Fatalf("recorded again after the loss: %s, %v (the lost one was %s)", idB2, err, idB)
	}
	if n := len(rdb.XRange(ctx, stream, "-", "+").Val()); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
}
