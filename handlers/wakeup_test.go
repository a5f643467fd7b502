package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A comment's republished copy (a release found its follow-up unaccounted for and
// published its event again: lockmw.MetaMailboxWake) stands for the mailbox, not for
// itself: its run takes the follow-ups from the mailbox alone. When a run in between
// already took the comment from the mailbox, the copy's run (started because another
// follow-up is left) is not handed the comment a second time.
func TestRepublishedCommentIsNotRolledTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-32", Summary: "s"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := e.locker()
	stream := e.topo.Stream("triage", "", true)
	// Another follow-up is left in the mailbox by an earlier run.
	holder, err := l.Acquire(ctx, "triage", "RHEL-32", lease.AcquireOptions{MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, "triage", "RHEL-32", lease.AcquireOptions{MessageID: "1-2", Deliver: &lease.DeliverOptions{
		Followup: map[string]any{"event_type": event.CommentCreated, "message_id": "1-2", "comment_id": "10078", "body": "the other"},
		Event:    lease.QueuedEvent{Stream: stream, Fields: map[string]any{"payload": "{}"}}}})
	if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Delivered {
		t.Fatalf("seed follow-up: %v", err)
	}
	if _, err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := &fixed{res: triageResult("not-affected", "")}
	h := e.handler("triage", "", r, func(c *handlers.Config) { c.Mailbox = true })
	cfg := e.Config("triage", "", "w1", l, h)
	cfg.Policy, cfg.Logger = lockmw.Deliver, e.log
	e.Start(ctx, cfg)

	msg := triageMsg(t, "RHEL-32", false, "")
	msg.Metadata.Set(event.MetaEventType, event.CommentCreated)
	msg.Metadata.Set(event.MetaCommentID, "10077")
	msg.Metadata.Set(event.MetaCommentBody, "already read by a run")
	msg.Metadata.Set(lockmw.MetaMailboxWake, "1-0")
	if _, err := e.pub.PublishID(ctx, stream, msg); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 20*time.Second, func() bool { return len(e.records(event.StageDone)) == 1 },
		"the republished event's run ends")
	var task struct {
		Followups []map[string]string `json:"followups"`
	}
	if err := json.Unmarshal(r.reqs[0].Payload, &task); err != nil {
		t.Fatal(err)
	}
	if len(task.Followups) != 1 || task.Followups[0]["comment_id"] != "10078" {
		t.Fatalf("Task JSON followups %v, want only the one left in the mailbox", task.Followups)
	}
}
