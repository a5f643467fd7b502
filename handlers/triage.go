package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/runners"
)

func (h *handler) triage(msg *message.Message) error {
	ctx := msg.Context()
	ev, err := h.begin(msg)
	if err != nil {
		return err
	}
	if ev.ended {
		return h.settle(ev)
	}
	p := ev.p
	if !p.claimed {
		if done, err := h.triageClaim(ctx, ev); done {
			return err
		}
	}
	if p.result == nil {
		res, accounting, err := h.run(ctx, ev)
		if accounting {
			return err // the run stands; the retry accounts for its follow-ups again
		}
		if err == nil && res.Resolution == runners.ResolutionError {
			err = fmt.Errorf("triage resolved to error: %s", errorDetails(res.Data))
		}
		if isBudgetExhausted(err) {
			return h.budgetExhausted(ctx, ev, err)
		}
		if err != nil {
			return h.triageFailed(ctx, ev, err)
		}
		p.result = &res
	}
	res := *p.result

	stream, dispatch := Dispatch(h.cfg.Topology, res.Resolution, res.TargetBranch, ev.userTriggered)
	label := ResolutionLabel(res.Resolution)
	if err := h.triageOutcome(ctx, ev, res, stream, label, dispatch); err != nil {
		return err
	}
	detail := map[string]any{"resolution": res.Resolution, "label": label, "target_branch": res.TargetBranch,
		"data": rawOrNull(res.Data)}
	if p.published {
		detail["stream"], detail["stream_id"] = p.stream, p.streamID
	} else if runners.IsDispatched(res.Resolution) {
		detail["dispatched"] = false
		detail["reason"] = "no target branch"
	}
	if err := h.record(ctx, ev, event.StageDone, res.Resolution, detail); err != nil {
		return err
	}
	ev.log.Info().Str("resolution", res.Resolution).Str("label", label).Bool("dispatched", p.published).Msg("triage done")
	return h.end(ev, nil)
}

// triageClaim is triage's first step: read the issue, skip it when closed or already
// handled, else claim it (labels.TriageInProgress) and, for a maintainer's request, say
// so on the issue. done says triage ends here, with err.
func (h *handler) triageClaim(ctx context.Context, ev *job) (done bool, err error) {
	p := ev.p
	issueLabels, status, known, err := h.readIssue(ctx, ev.key)
	if err != nil {
		return true, h.jiraErr(ctx, ev, "read the issue's labels and status", err)
	}
	if known && isClosed(status) {
		return true, h.skipClosed(ctx, ev, issueLabels, status)
	}
	if known && alreadyTriaged(issueLabels, ev.userTriggered) {
		return true, h.skip(ctx, ev, fmt.Sprintf("already handled: labels %s and no trigger", strings.Join(labels.Ymir(issueLabels), ",")))
	}
	var remove []string
	for _, l := range labels.Ymir(issueLabels) {
		if l != labels.TriageInProgress {
			remove = append(remove, l)
		}
	}
	if err := h.setLabels(ctx, ev, []string{labels.TriageInProgress}, remove); err != nil {
		return true, h.jiraErr(ctx, ev, "claim the issue ("+labels.TriageInProgress+")", err)
	}
	p.claimed = true
	if ev.userTriggered && !p.acked {
		h.comment(ctx, ev, "ymirflow picked up the triage request for "+ev.key+".")
		p.acked = true
	}

	return false, nil
}

// triageOutcome is triage's last step before its record: the resolution label, and for
// a resolution that dispatches, the downstream request published to stream, then the
// claim removed. Each part is done once (ev.p), so a retry resumes where it stopped.
func (h *handler) triageOutcome(ctx context.Context, ev *job, res runners.Result, stream, label string, dispatch bool) error {
	p := ev.p
	if !dispatch {
		if !p.labelled {
			if err := h.setLabels(ctx, ev, []string{label}, otherState(label)); err != nil {
				return h.jiraErr(ctx, ev, "write the resolution label "+label, err)
			}
			p.labelled, p.unclaimed = true, true
		}
	} else {
		// Label, publish, unclaim: the resolution label is there before the downstream
		// agent can see the request (it removes that label when done), and the claim
		// stays until the request is out, so a crash or a lost lease in between leaves
		// an issue that the redelivery triages again, never a labelled issue with no
		// request behind it.
		if !p.labelled {
			if err := h.setLabels(ctx, ev, []string{label}, otherState(label, labels.TriageInProgress)); err != nil {
				return h.jiraErr(ctx, ev, "write the resolution label "+label, err)
			}
			p.labelled = true
		}
		if !p.published {
			if err := aborted(ctx); err != nil {
				return err
			}
			out, err := h.downstreamEvent(ev, res)
			if err != nil {
				return fmt.Errorf("triage of %s: build the downstream request: %w", ev.key, err)
			}
			id, err := h.cfg.Publisher.PublishID(ctx, stream, out)
			if err != nil {
				return h.redisErr(ctx, ev, "publish the "+res.Resolution+" request", err)
			}
			p.published, p.stream, p.streamID = true, stream, id
			ev.log.Info().Str("stream", stream).Str("stream_id", id).Str("target_branch", res.TargetBranch).
				Msg("downstream request published")
		}
		if !p.unclaimed {
			if err := h.setLabels(ctx, ev, nil, []string{labels.TriageInProgress}); err != nil {
				return h.jiraErr(ctx, ev, "remove "+labels.TriageInProgress, err)
			}
			p.unclaimed = true
		}
	}
	return nil
}

// alreadyTriaged is triage's agent-side dedup, as the Python triage agent's:
// skip when a terminal ymir label is present and neither a retry trigger, an in-flight
// claim nor a maintainer's request says to run again.
func alreadyTriaged(issueLabels []string, userTriggered bool) bool {
	if userTriggered || slices.Contains(issueLabels, labels.RetryNeeded) || slices.Contains(issueLabels, labels.TriageInProgress) {
		return false
	}
	return slices.ContainsFunc(issueLabels, labels.IsTerminal)
}

func isClosed(status string) bool {
	return strings.EqualFold(status, "Closed") || strings.EqualFold(status, "Done")
}

func (h *handler) skipClosed(ctx context.Context, ev *job, issueLabels []string, status string) error {
	// Unlike upstream, the in-flight claim a fetcher flip left is removed too, or the
	// closed issue would look in flight for ever.
	var remove []string
	if slices.Contains(issueLabels, labels.TriageInProgress) {
		remove = append(remove, labels.TriageInProgress)
	}
	if ev.userTriggered && slices.Contains(issueLabels, labels.Todo) {
		remove = append(remove, labels.Todo)
	}
	if len(remove) > 0 && !ev.p.labelled {
		if err := h.setLabels(ctx, ev, nil, remove); err != nil {
			return h.jiraErr(ctx, ev, "remove "+strings.Join(remove, ","), err)
		}
		ev.p.labelled = true
	}
	if ev.userTriggered && !ev.p.acked {
		h.comment(ctx, ev, fmt.Sprintf("ymirflow: %s is already %s; nothing to triage.", ev.key, status))
		ev.p.acked = true
	}
	return h.skip(ctx, ev, "issue is "+status)
}

func (h *handler) skip(ctx context.Context, ev *job, reason string) error {
	detail := map[string]any{"reason": reason}
	if unseen := h.unseenFollowups(ctx, ev); len(unseen) > 0 {
		// A maintainer's comment that started this run, or waits in its mailbox, reaches
		// no agent when the run skips: the record says so.
		detail["followups_unseen"] = unseen
	}
	if err := h.record(ctx, ev, event.StageDone, "skipped", detail); err != nil {
		return err
	}
	ev.log.Info().Str("reason", reason).Msg("skipped")
	return h.end(ev, nil)
}

// unseenFollowups lists the follow-ups a skipped run leaves unseen, as the followup
// records name them: its own comment (a comment.created that met no live run) and,
// under the deliver policy, those in its lease's mailbox (earlier runs left them).
func (h *handler) unseenFollowups(ctx context.Context, ev *job) []map[string]string {
	var fs []runners.Followup
	if le, ok := lockmw.LeaseFrom(ctx); ok && h.cfg.Mailbox {
		got, err := le.Mailbox(ctx, "", h.cfg.MailboxDepth)
		if err != nil {
			ev.log.Warn().Err(err).Msg("could not read the mailbox of a skipped run (its follow-ups go unrecorded)")
		}
		fs = toRunner(got)
	}
	if own, ok := ownComment(ev.msg); ok && !slices.ContainsFunc(fs, func(f runners.Followup) bool {
		return f.Fields["comment_id"] == own.Fields["comment_id"]
	}) {
		fs = append(fs, own)
	}
	out := make([]map[string]string, 0, len(fs))
	for _, f := range fs {
		d := map[string]string{"followup_id": f.ID}
		for _, k := range []string{"event_type", "author", "comment_id"} {
			if v := f.Fields[k]; v != "" {
				d["followup_"+k] = v
			}
		}
		out = append(out, d)
	}
	return out
}

func (h *handler) triageFailed(ctx context.Context, ev *job, cause error) error {
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("triage of %s interrupted: %w: %w", ev.key, a, cause)
	}
	if !ev.last {
		ev.log.Warn().Err(cause).Int("max_retries", h.cfg.MaxRetries).Msg("triage failed; it will be retried")
		return cause
	}
	wctx, cancel := writable(ctx)
	defer cancel()
	if !ev.p.labelled {
		if err := h.setLabels(wctx, ev, []string{labels.TriageErrored}, otherState(labels.TriageErrored)); err != nil {
			return h.jiraErr(wctx, ev, "write "+labels.TriageErrored, err)
		}
		ev.p.labelled = true
	}
	if err := h.record(wctx, ev, event.StageFailed, labels.TriageErrored,
		map[string]any{"error": cause.Error(), "attempts": ev.delivery}); err != nil {
		return err
	}
	ev.log.Error().Err(cause).Msg("triage failed on its last attempt: " + labels.TriageErrored)
	return h.end(ev, recorded{fmt.Errorf("triage of %s failed %d times: %w", ev.key, ev.delivery, cause)})
}

// downstreamEvent builds the downstream request: the incoming Task with its unknown
// fields, metadata extended with the triage state (jira_issue, target_branch,
// triage_result, and the runner's extra fields), attempts back at 0.
func (h *handler) downstreamEvent(ev *job, res runners.Result) (*message.Message, error) {
	t := ev.task
	t.Metadata = maps.Clone(ev.task.Metadata)
	if t.Metadata == nil {
		t.Metadata = map[string]json.RawMessage{}
	}
	for k, v := range res.Extra {
		t.Metadata[k] = v
	}
	data := map[string]json.RawMessage{}
	if len(res.Data) > 0 && string(res.Data) != "null" {
		if err := json.Unmarshal(res.Data, &data); err != nil {
			return nil, fmt.Errorf("triage result data: %w", err)
		}
	}
	if _, ok := data["jira_issue"]; !ok {
		data["jira_issue"], _ = json.Marshal(ev.key)
	}
	if err := t.Set("jira_issue", ev.key); err != nil {
		return nil, err
	}
	if err := t.Set("target_branch", res.TargetBranch); err != nil {
		return nil, err
	}
	if err := t.Set("triage_result", map[string]any{"resolution": res.Resolution, "data": data}); err != nil {
		return nil, err
	}
	t.Attempts = 0
	t.UserTriggered = ev.userTriggered
	return event.New(event.RequestedEvent(res.Resolution), ev.key, t, ev.msg)
}

func rawOrNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}

func errorDetails(data json.RawMessage) string {
	var d struct {
		Details string `json:"details"`
	}
	if json.Unmarshal(data, &d) == nil && d.Details != "" {
		return d.Details
	}
	if len(data) == 0 {
		return "no details"
	}
	return string(data)
}
