// Package labels names the Jira labels of the ymir state machine, in one place for the
// fetcher that reads them (to decide what to publish) and the handlers that write them
// (to record each stage's outcome). The names are the Python agents' own (their
// constants.py JiraLabels enum), so both systems read each other's issues.
//
// It imports the standard library only.
package labels

import (
	"slices"
	"strings"
)

// Labels of the upstream JiraLabels enum.
const (
	TriageInProgress      = "ymir_triage_in_progress"
	Todo                  = "ymir_todo"
	RetryNeeded           = "ymir_retry_needed"
	CLITriage             = "ymir_cli_triage"
	ReproducerInProgress  = "ymir_reproducer_in_progress"
	RebaseSibling         = "ymir_rebase_sibling"
	RebaseWaitingSiblings = "ymir_rebase_waiting_for_siblings"

	TriagedRebase      = "ymir_triaged_rebase"
	TriagedBackport    = "ymir_triaged_backport"
	TriagedRebuild     = "ymir_triaged_rebuild"
	NeedsAttention     = "ymir_needs_attention"
	Triaged            = "ymir_triaged"
	TriagedPostponed   = "ymir_triaged_postponed"
	TriagedNotAffected = "ymir_triaged_not_affected"
	TriageErrored      = "ymir_triage_errored"

	Rebased           = "ymir_rebased"
	Backported        = "ymir_backported"
	Rebuilt           = "ymir_rebuilt"
	Merged            = "ymir_merged"
	MRClosed          = "ymir_mr_closed"
	Consolidated      = "ymir_consolidated"
	RebaseFailed      = "ymir_rebase_failed"
	BackportFailed    = "ymir_backport_failed"
	RebuildFailed     = "ymir_rebuild_failed"
	RebaseErrored     = "ymir_rebase_errored"
	BackportErrored   = "ymir_backport_errored"
	RebuildErrored    = "ymir_rebuild_errored"
	ReproCreated      = "ymir_reproducer_created"
	ReproFailed       = "ymir_reproducer_failed"
	ReproErrored      = "ymir_reproducer_errored"
	ReproNotReproduce = "ymir_reproducer_not_reproducible"
	ReproExists       = "ymir_reproducer_already_exists"
	ConsolidateBase   = "ymir_consolidate_base"
	ConsolidateNext   = "ymir_consolidate_next"
)

// BudgetExhausted parks an issue whose agents' budget is exhausted (not in the upstream
// enum): the handlers add it, the fetcher re-runs nothing that carries it, and a
// maintainer's approval through the webhook resumes the parked requests.
const BudgetExhausted = "ymir_budget_exhausted"

// BudgetApproved is a maintainer's budget approval by label (not in the upstream enum):
// the webhook raises the budget by its configured amount, resumes the parked
// requests and removes the label, so that it can be added again for the next approval.
const BudgetApproved = "ymir_budget_approved"

// Families of labels, by their form.
const (
	// Prefix marks every ymir label, including legacy ones outside the enum.
	Prefix = "ymir_"
	// ReproducerPrefix marks the reproducer agent's labels.
	ReproducerPrefix = "ymir_reproducer_"
	// InProgressSuffix ends the labels of work in progress (ymir_triage_in_progress,
	// ymir_reproducer_in_progress; not ymir_triaged_*).
	InProgressSuffix = "_in_progress"
)

// enum is the upstream JiraLabels enum.
var enum = []string{
	TriageInProgress, Todo, RetryNeeded, CLITriage, ReproducerInProgress,
	RebaseSibling, RebaseWaitingSiblings,
	TriagedRebase, TriagedBackport, TriagedRebuild, NeedsAttention, Triaged,
	TriagedPostponed, TriagedNotAffected, TriageErrored,
	Rebased, Backported, Rebuilt, Merged, MRClosed, Consolidated,
	RebaseFailed, BackportFailed, RebuildFailed, RebaseErrored, BackportErrored, RebuildErrored,
	ReproCreated, ReproFailed, ReproErrored, ReproNotReproduce, ReproExists,
	ConsolidateBase, ConsolidateNext,
}

// InFlight returns the labels whose staleness the fetcher recovers (upstream
// IN_FLIGHT_LABELS), in the order they are looked for.
func InFlight() []string {
	return []string{TriageInProgress, TriagedBackport, TriagedRebase, TriagedRebuild, CLITriage, ReproducerInProgress}
}

// Ymir returns the labels that start with ymir_, in their order.
func Ymir(ls []string) []string {
	var out []string
	for _, l := range ls {
		if strings.HasPrefix(l, Prefix) {
			out = append(out, l)
		}
	}
	return out
}

// IsTerminal reports whether label counts as "already handled" for triage's
// agent-side dedup: every label of the upstream enum except the in-flight ones
// (ymir_triage_in_progress, ymir_rebase_sibling, ymir_rebase_waiting_for_siblings)
// and the maintainer trigger ymir_todo (as the Python triage agent's dedup before a run).
func IsTerminal(label string) bool {
	switch label {
	case TriageInProgress, RebaseSibling, RebaseWaitingSiblings, Todo:
		return false
	}
	return slices.Contains(enum, label)
}

// TriagedFor is ymir_triaged_<agent>, the label that marks an issue waiting for (or
// being worked on by) a downstream agent.
func TriagedFor(agent string) string { return "ymir_triaged_" + agent }

// DoneFor is the label a downstream agent writes on success: ymir_rebased,
// ymir_backported, ymir_rebuilt ("" for another agent).
func DoneFor(agent string) string {
	switch agent {
	case "rebase":
		return Rebased
	case "backport":
		return Backported
	case "rebuild":
		return Rebuilt
	}
	return ""
}

// FailedFor is ymir_<agent>_failed, written on a clean failure of a user-triggered run
// that will be retried.
func FailedFor(agent string) string { return "ymir_" + agent + "_failed" }

// ErroredFor is ymir_<agent>_errored (ymir_triage_errored for triage), written when the
// retries are exhausted.
func ErroredFor(agent string) string { return "ymir_" + agent + "_errored" }
