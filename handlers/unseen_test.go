package handlers_test

import (
	"context"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// Issue 35 item 4: a maintainer's comment that met no live run, on an issue its run
// triaged meanwhile, runs as a triage request that skips ("already handled"): no agent
// sees the comment, and the skip's record says so (followups_unseen names it), instead
// of nothing recording that the running agent never saw it.
func TestSkippedCommentRunRecordsTheCommentUnseen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-32", Summary: "s", Labels: []string{labels.TriagedRebase}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, id := commentToDeliveringTriage(ctx, t, e, "RHEL-32", "10078")
	redistest.Eventually(t, 20*time.Second, func() bool { return len(e.records(event.StageDone)) == 1 }, "the comment's run ends")
	rec := e.records(event.StageDone)[0]
	if rec["outcome"] != "skipped" || r.n() != 0 {
		t.Fatalf("record %v after %d runs, want a skip without a run", rec, r.n())
	}
	unseen, _ := detail(t, rec)["followups_unseen"].([]any)
	if len(unseen) != 1 {
		t.Fatalf("skip detail %v: want the comment in followups_unseen", rec["detail"])
	}
	if f, _ := unseen[0].(map[string]any); f["followup_comment_id"] != "10078" || f["followup_author"] != "ann" || f["followup_id"] != id {
		t.Fatalf("followups_unseen %v, want comment 10078 by ann, entry %s", unseen, id)
	}
}
