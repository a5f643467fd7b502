package handlers_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
)

// A maintainer's comment (comment.created, as the webhook publishes it for a run) that
// meets no live run, because that run ended before a worker read it, runs as the
// stage's request under the deliver policy, and its agent still gets the comment: in
// its Task JSON followups, recorded followup.rolled. Not lost, and not handed twice.
func TestCommentMeetingNoRunIsRolledIntoItsOwnRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-31", Summary: "s"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, id := commentToDeliveringTriage(ctx, t, e, "RHEL-31", "10077")
	redistest.Eventually(t, 20*time.Second, func() bool {
		return len(e.records(event.StageDone)) == 1 && len(e.records(event.FollowupRolled)) == 1
	}, "the comment's run ends with the comment rolled into it")
	if n := r.n(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
	var task struct {
		Followups []map[string]string `json:"followups"`
	}
	if err := json.Unmarshal(r.reqs[0].Payload, &task); err != nil {
		t.Fatal(err)
	}
	if len(task.Followups) != 1 || task.Followups[0]["id"] != id || task.Followups[0]["author"] != "ann" ||
		task.Followups[0]["body"] != "also update the tests" || task.Followups[0]["comment_id"] != "10077" ||
		task.Followups[0]["event_type"] != event.CommentCreated {
		t.Fatalf("Task JSON followups %v, want the comment once", task.Followups)
	}
	if d := detail(t, e.records(event.FollowupRolled)[0]); d["followup_comment_id"] != "10077" || d["followup_author"] != "ann" {
		t.Fatalf("followup.rolled detail %v", d)
	}
}

// commentToDeliveringTriage starts a triage worker under the deliver policy whose agent
// answers not-affected, and publishes a maintainer's comment on issue (its todo
// stream). It returns the agent and the comment's entry id.
func commentToDeliveringTriage(ctx context.Context, t *testing.T, e *env, issue, commentID string) (*fixed, string) {
	t.Helper()
	r := &fixed{res: triageResult("not-affected", "")}
	h := e.handler("triage", "", r, func(c *handlers.Config) { c.Mailbox = true })
	cfg := e.Config("triage", "", "w1", e.locker(), h)
	cfg.Policy, cfg.Logger = lockmw.Deliver, e.log
	e.Start(ctx, cfg)

	msg := triageMsg(t, issue, false, "")
	msg.Metadata.Set(event.MetaEventType, event.CommentCreated)
	msg.Metadata.Set(event.MetaCommentID, commentID)
	msg.Metadata.Set(event.MetaCommentAuthor, "ann")
	msg.Metadata.Set(event.MetaCommentBody, "also update the tests")
	id, err := e.pub.PublishID(ctx, e.topo.Stream("triage", "", true), msg)
	if err != nil {
		t.Fatal(err)
	}
	return r, id
}
