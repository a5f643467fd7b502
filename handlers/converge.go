package handlers

import (
	"context"
	"slices"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/runners"
)

// stateLabels are the labels the handlers write: an issue's place in the pipeline. The
// triggers (ymir_todo, ymir_retry_needed) and the labels of other tools are not among
// them, so asserting a state never touches them.
func stateLabels() []string {
	// The park label of an exhausted budget too: the resumed run's state replaces it.
	out := []string{labels.TriageInProgress, labels.TriageErrored, LabelBudgetExhausted}
	for _, r := range runners.Resolutions {
		if l := ResolutionLabel(r); l != "" {
			out = append(out, l)
		}
	}
	for _, a := range event.Agents[1:] {
		out = append(out, labels.DoneFor(a), labels.FailedFor(a), labels.ErroredFor(a))
	}
	return out
}

// otherState returns the state labels not in keep: what a write that asserts keep
// removes. Every terminal label write of a handler asserts its whole state this way, so a
// label that a stale holder wrote late does not survive the newer holder's next write.
func otherState(keep ...string) []string {
	return slices.DeleteFunc(stateLabels(), func(l string) bool { return slices.Contains(keep, l) })
}

// impliedLabels returns the state labels that an issue's terminal records (newest first)
// imply: the newest triage outcome decides, and for rebase, backport and rebuild the
// newest outcome of that agent recorded after it. Nil when no triage outcome is known.
func impliedLabels(recs []event.Record) []string {
	ti := slices.IndexFunc(recs, func(r event.Record) bool { return r.Agent == "triage" && r.Outcome != "skipped" })
	if ti < 0 {
		return nil
	}
	tr := recs[ti]
	if tr.EventType == event.StageFailed {
		return []string{labels.TriageErrored}
	}
	label := ResolutionLabel(tr.Outcome)
	if label == "" {
		return nil
	}
	if runners.IsDispatched(tr.Outcome) {
		for _, r := range recs[:ti] {
			if r.Agent != tr.Outcome {
				continue
			}
			if r.EventType == event.StageFailed {
				return []string{labels.ErroredFor(r.Agent)}
			}
			return []string{labels.DoneFor(r.Agent)}
		}
	}
	return []string{label}
}

// convergeWait bounds how long converge waits for a live holder of the issue to finish
// before leaving the labels to that holder's own writes.
const convergeWait = 30 * time.Second

// converge re-asserts the labels implied by the issue's last recorded outcomes after a
// label write of ours may have landed on a newer holder's state (the lease was lost
// while it was in flight). While another holder of the issue (any agent) is live, its
// own writes assert its state, so converge waits for it to end (up to the lease TTL,
// at most convergeWait) and then reads the outcome it recorded. Best effort: failures
// are logged, and a pause here is bounded by the next write of a newer holder.
func (h *handler) converge(parent context.Context, ev *job) {
	le, ok := lockmw.LeaseFrom(parent)
	if !ok || h.cfg.Jira == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), convergeWait+10*time.Second)
	defer cancel()
	locker := le.Locker()
	deadline := time.Now().Add(min(locker.TTL(), convergeWait))
	for {
		live, err := h.liveHolder(ctx, locker, ev)
		if err != nil {
			ev.log.Warn().Err(err).Msg("labels not converged: the issue's leases could not be read")
			return
		}
		if live == "" {
			break
		}
		if time.Now().After(deadline) {
			ev.log.Warn().Str("holder_agent", live).Msg("labels not converged: a live holder's writes assert its state")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	recs, err := h.cfg.Results.Outcomes(ctx, ev.key, 0)
	if err != nil {
		ev.log.Warn().Err(err).Msg("labels not converged: the outcomes could not be read")
		return
	}
	want := impliedLabels(recs)
	if want == nil {
		return
	}
	labels, _, _, err := h.readIssue(ctx, ev.key)
	if err != nil {
		ev.log.Warn().Err(err).Msg("labels not converged: the issue could not be read")
		return
	}
	var add, remove []string
	for _, l := range want {
		if !slices.Contains(labels, l) {
			add = append(add, l)
		}
	}
	for _, l := range otherState(want...) {
		if slices.Contains(labels, l) {
			remove = append(remove, l)
		}
	}
	if len(add) == 0 && len(remove) == 0 {
		return
	}
	// Checked again just before the write, in one round trip: a run that started while
	// the outcomes and the issue were read claims the issue with labels this write
	// would remove. Its own writes assert its state; converging is left to them. (Jira
	// and Redis share no transaction, so a run starting during the write itself is not
	// excluded: that window is one Jira round trip, where it was several.)
	if live, err := h.liveHolder(ctx, locker, ev); err != nil || live != "" {
		ev.log.Warn().Err(err).Str("holder_agent", live).Msg("labels not converged: a run of the issue started meanwhile")
		return
	}
	if err := h.cfg.Jira.UpdateLabels(ctx, ev.key, add, remove); err != nil {
		ev.log.Warn().Err(err).Msg("labels not converged: the write failed")
		return
	}
	ev.log.Info().Strs("add", add).Strs("remove", remove).Strs("labels", want).
		Msg("labels converged to the last recorded outcome")
}

// liveHolder names an agent that holds a live lease of the issue other than this run's
// own (one round trip for every agent's lease), or "".
func (h *handler) liveHolder(ctx context.Context, locker *lease.Locker, ev *job) (string, error) {
	refs := make([]lease.Ref, 0, len(event.Agents))
	for _, a := range event.Agents {
		refs = append(refs, lease.Ref{Agent: a, Issue: ev.key})
	}
	infos, err := locker.InspectMany(ctx, refs)
	if err != nil {
		return "", err
	}
	for _, r := range refs {
		if info, ok := infos[r]; ok && (r.Agent != h.cfg.Agent || info.Fence != ev.fence) {
			return r.Agent, nil
		}
	}
	return "", nil
}
