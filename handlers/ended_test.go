package handlers_test

import (
	"errors"
	"testing"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/runners"
)

// An event whose outcome is recorded can still be delivered again: its ack or its dead
// letter failed (a Redis timeout on a loaded machine), so the entry stayed pending.
// That delivery settles it with the outcome it had, without running the agent again
// and without a second terminal record (the demo saw stage.failed then stage.done for
// one entry under load).
func TestDeliveredAgainAfterItsOutcomeIsRecordedSettlesWithoutARun(t *testing.T) {
	t.Parallel()
	t.Run("failed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, fakejira.Issue{Key: "RHEL-30", Labels: []string{"ymir_retry_needed"}})
		r := &fixed{err: errors.New("agent crashed")}
		h := e.handler("triage", "", r)
		msg := triageMsg(t, "RHEL-30", false, "")
		for n := 1; n <= 3; n++ {
			err := attempt(h, msg, n)
			if err == nil {
				t.Fatalf("attempt %d succeeded", n)
			}
			if recorded := errors.Is(err, event.ErrOutcomeRecorded); recorded != (n == 3) {
				t.Fatalf("attempt %d: ErrOutcomeRecorded %v: %v", n, recorded, err)
			}
		}
		// The dead letter failed; the entry comes back, with its attempt counted on or,
		// read afresh from the stream, counted from one.
		for _, n := range []int{4, 1} {
			err := attempt(h, msg, n)
			if !errors.Is(err, event.ErrOutcomeRecorded) || !errors.Is(err, r.err) {
				t.Fatalf("delivered again (attempt %d): %v, want the recorded failure", n, err)
			}
		}
		if r.n() != 3 {
			t.Fatalf("runner ran %d times, want 3", r.n())
		}
		if recs := e.recordsOf("RHEL-30", "triage"); len(recs) != 1 || recs[0]["event_type"] != event.StageFailed {
			t.Fatalf("records %v, want one stage.failed", recs)
		}
		e.wantLabels("RHEL-30", "ymir_triage_errored")
	})
	t.Run("done", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, fakejira.Issue{Key: "RHEL-31", Labels: []string{"ymir_triaged_backport"}})
		r := &fixed{res: runners.Result{Success: true, MergeRequestURL: "https://mr/31"}}
		h := e.handler("backport", "c10s", r)
		msg := downstreamMsg(t, "backport", "RHEL-31", "rhel-10.1", false)
		for _, n := range []int{1, 2, 1} {
			if err := attempt(h, msg, n); err != nil {
				t.Fatalf("attempt %d: %v", n, err)
			}
		}
		if r.n() != 1 {
			t.Fatalf("runner ran %d times, want 1", r.n())
		}
		if recs := e.recordsOf("RHEL-31", "backport"); len(recs) != 1 || recs[0]["event_type"] != event.StageDone {
			t.Fatalf("records %v, want one stage.done", recs)
		}
	})
}
