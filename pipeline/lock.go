package pipeline

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The pipeline's side of the lock middleware: where an event's issue key is, and how a
// conflict is recorded in the results stream.

// issueKeyOf is the raw issue key of an event: metadata issue_key (Validate has put the
// canonical key there before the lock middleware runs), else the Task payload's
// metadata.issue or metadata.jira_issue. It errs with lockmw.ErrNoIssueKey.
func issueKeyOf(msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(event.MetaIssueKey); k != "" {
		return k, nil
	}
	task, err := event.ParseTask(msg.Payload)
	if err != nil {
		return "", errors.Join(lockmw.ErrNoIssueKey, err)
	}
	if k := task.IssueKey(); k != "" {
		return k, nil
	}
	return "", lockmw.ErrNoIssueKey
}

// conflictRecorder writes a lock.dropped, lock.coalesced, lock.delivered, lock.delayed or
// lock.superseded record to the results
// stream, in the round trip that acks the event.
func conflictRecorder(stream string, maxLen int64) lockmw.ConflictRecorder {
	return func(ctx context.Context, pipe redis.Pipeliner, c lockmw.Conflict) {
		eventType, reason := event.LockDropped, "locked"
		switch {
		case c.Waited:
			eventType = event.LockWaited
		case c.Delivered:
			eventType = event.LockDelivered
		case c.Queued:
			eventType = event.LockCoalesced
		case c.Delayed:
			eventType = event.LockDelayed
		case c.Superseded && c.Policy == lockmw.Supersede:
			eventType = event.LockSuperseded
		}
		if c.Superseded {
			reason = "superseded"
		}
		// One record per entry, however often it is sent: go-redis's retry after a lost
		// reply, or the entry's redelivery after a crash between record and ack.
		id := "conflict-" + c.Entry.Stream + "-" + c.Entry.ID
		if c.Entry.ID == "" {
			id = xonce.NewID() // not read from a stream: nothing redelivers it
		}
		issue := c.Issue
		if issue == "" {
			issue = c.Holder.Issue
		}
		values := map[string]any{
			"event_type":        eventType,
			"issue_key":         issue,
			"agent":             c.Agent,
			"message_id":        c.Entry.ID,
			"stream":            c.Entry.Stream,
			"uuid":              c.Message.UUID,
			"correlation_id":    c.Message.Metadata.Get(event.MetaCorrelationID),
			"holder":            c.Holder.Owner,
			"holder_fence":      c.Holder.Fence,
			"holder_message_id": c.Holder.MessageID,
			"replaced":          strconv.FormatBool(c.Replaced),
			"reason":            reason,
			"mailbox_id":        c.MailboxID,
			"at":                time.Now().UTC().Format(time.RFC3339Nano),
		}
		if eventType == event.LockSuperseded {
			values["cancelled"], values["ran"] = strconv.FormatBool(c.Cancelled), strconv.FormatBool(c.Ran)
		}
		if c.Waited {
			values["position"] = strconv.FormatInt(c.Position, 10)
			if !c.OldestAt.IsZero() {
				values["oldest_waiting_since"] = c.OldestAt.UTC().Format(time.RFC3339Nano)
			}
		}
		if c.Delayed {
			values["delayed_until"] = c.Until.UTC().Format(time.RFC3339Nano)
			values["delays"] = strconv.Itoa(c.Delays)
		}
		if c.Holder.Scope != "" && c.Holder.Scope != lease.ScopeAgent {
			// A shared key was busy: name it, and the run holding it.
			values["scope"], values["lock_key"] = string(c.Holder.Scope), c.Holder.Key
			values["holder_agent"], values["holder_issue"] = c.Holder.Agent, c.Holder.Issue
		}
		xonce.Queue(ctx, pipe, xonce.Append{Stream: stream, ID: id, Issue: event.IndexIssue(issue), MaxLen: maxLen, Values: values})
	}
}
