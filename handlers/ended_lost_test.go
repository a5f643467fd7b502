package handlers_test

import (
	"context"
	"testing"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/runners"
)

// A failover to a replica that had not received an outcome record loses the record and
// the ack after it, so the event comes back to the handler that remembers ending it.
// Settling it then would ack it with no outcome anywhere: the handler finds its record
// gone from the results stream and runs the event again, which records it once.
func TestDeliveredAgainWithItsOutcomeLostRunsAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-32", Labels: []string{"ymir_triaged_backport"}})
	r := &fixed{res: runners.Result{Success: true, MergeRequestURL: "https://mr/32"}}
	h := e.handler("backport", "c10s", r)
	msg := downstreamMsg(t, "backport", "RHEL-32", "rhel-10.1", false)
	if err := attempt(h, msg, 1); err != nil {
		t.Fatal(err)
	}
	// What the failover forgets: the results stream as it was before the record.
	if err := e.rdb.Del(context.Background(), e.topo.Results()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := attempt(h, msg, 1); err != nil {
		t.Fatalf("delivered again with its record lost: %v", err)
	}
	if r.n() != 2 {
		t.Fatalf("runner ran %d times, want 2 (the record was lost, so the event runs again)", r.n())
	}
	if recs := e.recordsOf("RHEL-32", "backport"); len(recs) != 1 || recs[0]["event_type"] != event.StageDone {
		t.Fatalf("records %v, want one stage.done", recs)
	}
	// Delivered once more: the record is there now, so it settles without a run.
	if err := attempt(h, msg, 1); err != nil || r.n() != 2 {
		t.Fatalf("third delivery: %v, runner ran %d times, want 2", err, r.n())
	}
}
