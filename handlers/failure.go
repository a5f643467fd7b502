package handlers

import (
	"context"
	"fmt"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/pipeline"
)

// FailureNotice returns the pipeline.RouterConfig.OnDead of cfg's agent: when a
// user-triggered event has used up its attempts and is in the dead-letter stream, the
// issue gets a comment with the outcome, the attempt count and the dead letter's id.
// The comment never quotes the agent's output: its stderr may hold anything, and the
// comment may be public (JIRA_COMMENT_GROUP empty). Operators read the redacted,
// bounded stderr tail with `ymirflow dlq show ID`.
func FailureNotice(cfg Config) func(ctx context.Context, d pipeline.Dead) {
	outcome := labels.ErroredFor(cfg.Agent)
	if cfg.Agent == "triage" {
		outcome = labels.TriageErrored
	}
	log := cfg.Logger.With().Str("agent", cfg.Agent).Logger()
	return func(ctx context.Context, d pipeline.Dead) {
		key := d.Msg.Metadata.Get(event.MetaIssueKey)
		if key == "" || !userTriggered(d) {
			return
		}
		body := FailureComment(cfg.Agent, key, outcome, d.Attempts, d.DeadID)
		l := log.With().Str("issue_key", key).Str("dead_letter_id", d.DeadID).Logger()
		if cfg.Jira == nil || cfg.DryRun {
			l.Info().Str("comment", body).Bool("dry_run", true).Msg("jira comment not posted (dry run)")
			return
		}
		if err := cfg.Jira.AddComment(ctx, key, cfg.Redactor.String(body)); err != nil {
			l.Warn().Err(err).Msg("could not post the failure comment (not critical)")
		}
	}
}

// FailureComment is the text of a failure comment: what happened and where an operator
// finds out why, nothing the agent wrote.
func FailureComment(agent, key, outcome string, attempts int, deadID string) string {
	return fmt.Sprintf("ymirflow: %s of %s failed after %d attempts (outcome: %s). The event is in the dead-letter stream "+
		"as %s; an operator can read why with `ymirflow dlq show %s`.", agent, key, attempts, outcome, deadID, deadID)
}

func userTriggered(d pipeline.Dead) bool {
	if d.Msg.Metadata.Get(event.MetaUserTriggered) == "true" {
		return true
	}
	t, err := event.ParseTask(d.Msg.Payload)
	return err == nil && t.UserTriggered
}
