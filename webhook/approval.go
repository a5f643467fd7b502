package webhook

import (
	"context"
	"fmt"
	"net/http"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
)

// handleApproval acts on a comment that approves more budget ("/ymir budget +N",
// agentctl.ParseApproval): when its author is in the fetcher's trigger group, the
// issue's budget is raised by N USD once per comment id (a redelivery, or a retry after
// a failed publish, adds nothing), and the requests parked for the budget
// (agentctl.Ledger.Park) are published again to their streams, so the work resumes from
// its last checkpoint. A comment from anyone else raises nothing (approval_untrusted).
func (r *Receiver) handleApproval(ctx context.Context, key string, e Event, usd float64) result {
	ok, who, err := r.cfg.Fetcher.InTriggerGroup(ctx, e.Comment.Author)
	if err != nil {
		return jiraFailed(key, "check the approver's group", err)
	}
	if !ok {
		return result{status: http.StatusAccepted, outcome: "approval_untrusted", issue: key,
			detail: fmt.Sprintf("budget approval by %q, not a member of the trigger group: nothing raised", who)}
	}
	raised, err := r.ledger.Raise(ctx, key, usd, "comment:"+e.Comment.ID)
	if err != nil {
		return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: the budget was not raised", err: err}
	}
	n, err := r.resumeParked(ctx, key)
	if err != nil {
		return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: a parked request was not published", err: err}
	}
	return result{status: http.StatusAccepted, outcome: "budget_raised", issue: key,
		detail: fmt.Sprintf("comment %s by %s: budget raised by %.2f USD in total, %d parked request(s) resumed", e.Comment.ID, who, raised, n)}
}

// resumeParked publishes again the requests of key parked for their budget and returns
// how many. One that fails to publish is parked again (a later delivery of the approval,
// or the next approval, publishes it) and the error returned, so the delivery is retried.
func (r *Receiver) resumeParked(ctx context.Context, key string) (int, error) {
	parked, err := r.ledger.TakeParked(ctx, key)
	if err != nil {
		return 0, err
	}
	n := 0
	for i, p := range parked {
		msg, err := parkedMessage(key, p)
		if err != nil {
			r.log.Error().Err(err).Str("issue_key", key).Str("agent", p.Agent).Msg("parked request dropped: not a valid request")
			continue
		}
		if _, err := r.pub.PublishID(ctx, p.Stream, msg); err != nil {
			for _, q := range parked[i:] {
				_ = r.ledger.Park(context.WithoutCancel(ctx), key, q)
			}
			return n, fmt.Errorf("publish the parked %s request of %s: %w", p.Agent, key, err)
		}
		r.log.Info().Str("issue_key", key).Str("agent", p.Agent).Str("stream", p.Stream).Msg("parked request resumed after a budget approval")
		n++
	}
	return n, nil
}

func parkedMessage(key string, p agentctl.Parked) (*message.Message, error) {
	task, err := event.ParseTask(p.Payload)
	if err != nil {
		return nil, err
	}
	return event.New(p.EventType, key, task, nil)
}
