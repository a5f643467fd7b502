package webhook

import (
	"context"
	"fmt"
	"net/http"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// handleApproval acts on a comment that approves more budget ("/ymir budget +N",
// agentctl.ParseApproval): when its author is in the fetcher's trigger group, the
// issue's budget is raised by N USD once per comment id (a redelivery, or a retry after
// a failed publish, adds nothing), and the requests parked for the budget
// (agentctl.Ledger.Park) are published again to their streams, so the work resumes from
// its last checkpoint. A comment from anyone else raises nothing (approval_untrusted).
func (r *Receiver) handleApproval(ctx context.Context, key string, e Event, usd float64) result {
	return r.approve(ctx, key, e.Comment.Author, usd, "comment:"+e.Comment.ID, "comment "+e.Comment.ID)
}

// handleLabelApproval acts on ymir_budget_approved added to an issue: approve as a
// comment would, by Config.ApprovalLabelUSD, once per changelog id; then the label is
// removed (trusted or not), so that the next approval can add it again. A failed
// removal is logged: the raise stands, and a later change's delivery names another
// changelog id only when the label is added again.
func (r *Receiver) handleLabelApproval(ctx context.Context, key string, e Event) result {
	res := r.approve(ctx, key, *e.User, r.cfg.ApprovalLabelUSD, "label:"+e.Changelog.ID, "label "+labels.BudgetApproved)
	if res.status >= 300 {
		return res
	}
	if err := r.cfg.Jira.UpdateLabels(ctx, key, nil, []string{labels.BudgetApproved}); err != nil {
		r.log.Warn().Err(err).Str("issue_key", key).Msg("approval label not removed: remove it by hand before the next approval")
	}
	return res
}

// approve raises key's budget by usd once per once (the approval's name) when who is
// in the trigger group, and resumes the parked requests; what names the approval in
// the answer.
func (r *Receiver) approve(ctx context.Context, key string, who jira.User, usd float64, once, what string) result {
	ok, id, err := r.cfg.Fetcher.InTriggerGroup(ctx, who)
	if err != nil {
		return jiraFailed(key, "check the approver's group", err)
	}
	if !ok {
		return result{status: http.StatusAccepted, outcome: "approval_untrusted", issue: key,
			detail: fmt.Sprintf("budget approval (%s) by %q, not a member of the trigger group: nothing raised", what, id)}
	}
	raised, err := r.ledger.Raise(ctx, key, usd, once)
	if err != nil {
		return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: the budget was not raised", err: err}
	}
	n, err := r.resumeParked(ctx, key)
	if err != nil {
		return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis: a parked request was not published", err: err}
	}
	return result{status: http.StatusAccepted, outcome: "budget_raised", issue: key,
		detail: fmt.Sprintf("%s by %s: budget raised by %.2f USD in total, %d parked request(s) resumed", what, id, raised, n)}
}

// resumeParked publishes again the requests of key parked for their budget and returns
// how many (agentctl.Ledger.ResumeParked: each is forgotten only after its publish,
// which is idempotent by the parked request's id). One that fails stays parked and the
// error is returned, so the delivery is retried and the retry finishes it.
func (r *Receiver) resumeParked(ctx context.Context, key string) (int, error) {
	done, err := r.ledger.ResumeParked(ctx, key, func(ctx context.Context, p agentctl.Parked) (string, error) {
		msg, err := parkedMessage(key, p)
		if err != nil {
			return "", fmt.Errorf("%w: %w", agentctl.ErrParkedInvalid, err)
		}
		return r.pub.PublishOnce(ctx, p.Stream, msg, p.OnceID(), agentctl.ParkedOnceTTL)
	})
	n := 0
	for _, d := range done {
		if d.Dropped != nil {
			r.log.Error().Err(d.Dropped).Str("issue_key", key).Str("agent", d.Agent).Msg("parked request dropped: not a valid request")
			continue
		}
		r.log.Info().Str("issue_key", key).Str("agent", d.Agent).Str("stream", d.Stream).Str("entry_id", d.EntryID).
			Msg("parked request resumed after a budget approval")
		n++
	}
	return n, err
}

func parkedMessage(key string, p agentctl.Parked) (*message.Message, error) {
	task, err := event.ParseTask(p.Payload)
	if err != nil {
		return nil, err
	}
	return event.New(p.EventType, key, task, nil)
}
