package handlers

import (
	"slices"
	"strings"

	"github.com/ymirflow/ymirflow/pipeline"
)

// Jira labels of the ymir state machine (upstream constants.py JiraLabels).
const (
	LabelTriageInProgress      = "ymir_triage_in_progress"
	LabelTodo                  = "ymir_todo"
	LabelRetryNeeded           = "ymir_retry_needed"
	LabelCLITriage             = "ymir_cli_triage"
	LabelReproducerInProgress  = "ymir_reproducer_in_progress"
	LabelRebaseSibling         = "ymir_rebase_sibling"
	LabelRebaseWaitingSiblings = "ymir_rebase_waiting_for_siblings"

	LabelTriagedRebase      = "ymir_triaged_rebase"
	LabelTriagedBackport    = "ymir_triaged_backport"
	LabelTriagedRebuild     = "ymir_triaged_rebuild"
	LabelNeedsAttention     = "ymir_needs_attention"
	LabelTriaged            = "ymir_triaged"
	LabelTriagedPostponed   = "ymir_triaged_postponed"
	LabelTriagedNotAffected = "ymir_triaged_not_affected"
	LabelTriageErrored      = "ymir_triage_errored"

	LabelRebased           = "ymir_rebased"
	LabelBackported        = "ymir_backported"
	LabelRebuilt           = "ymir_rebuilt"
	LabelMerged            = "ymir_merged"
	LabelMRClosed          = "ymir_mr_closed"
	LabelConsolidated      = "ymir_consolidated"
	LabelRebaseFailed      = "ymir_rebase_failed"
	LabelBackportFailed    = "ymir_backport_failed"
	LabelRebuildFailed     = "ymir_rebuild_failed"
	LabelRebaseErrored     = "ymir_rebase_errored"
	LabelBackportErrored   = "ymir_backport_errored"
	LabelRebuildErrored    = "ymir_rebuild_errored"
	LabelReproCreated      = "ymir_reproducer_created"
	LabelReproFailed       = "ymir_reproducer_failed"
	LabelReproErrored      = "ymir_reproducer_errored"
	LabelReproNotReproduce = "ymir_reproducer_not_reproducible"
	LabelReproExists       = "ymir_reproducer_already_exists"
	LabelConsolidateBase   = "ymir_consolidate_base"
	LabelConsolidateNext   = "ymir_consolidate_next"

	// LabelPrefix marks every ymir label, including legacy ones outside the enum.
	LabelPrefix = "ymir_"
)

// Resolutions a triage runner may return (upstream models.py Resolution).
const (
	ResolutionRebase        = "rebase"
	ResolutionBackport      = "backport"
	ResolutionRebuild       = "rebuild"
	ResolutionClarification = "clarification-needed"
	ResolutionOpenEnded     = "open-ended-analysis"
	ResolutionPostponed     = "postponed"
	ResolutionNotAffected   = "not-affected"
	ResolutionError         = "error"
)

// Resolutions lists every resolution, in the upstream enum's order.
var Resolutions = []string{ResolutionRebase, ResolutionBackport, ResolutionRebuild, ResolutionClarification,
	ResolutionOpenEnded, ResolutionPostponed, ResolutionNotAffected, ResolutionError}

// enumLabels is the upstream JiraLabels enum.
var enumLabels = []string{
	LabelTriageInProgress, LabelTodo, LabelRetryNeeded, LabelCLITriage, LabelReproducerInProgress,
	LabelRebaseSibling, LabelRebaseWaitingSiblings,
	LabelTriagedRebase, LabelTriagedBackport, LabelTriagedRebuild, LabelNeedsAttention, LabelTriaged,
	LabelTriagedPostponed, LabelTriagedNotAffected, LabelTriageErrored,
	LabelRebased, LabelBackported, LabelRebuilt, LabelMerged, LabelMRClosed, LabelConsolidated,
	LabelRebaseFailed, LabelBackportFailed, LabelRebuildFailed, LabelRebaseErrored, LabelBackportErrored, LabelRebuildErrored,
	LabelReproCreated, LabelReproFailed, LabelReproErrored, LabelReproNotReproduce, LabelReproExists,
	LabelConsolidateBase, LabelConsolidateNext,
}

// IsTerminalLabel reports whether label counts as "already handled" for triage's
// agent-side dedup: every label of the upstream enum except the in-flight ones
// (ymir_triage_in_progress, ymir_rebase_sibling, ymir_rebase_waiting_for_siblings)
// and the maintainer trigger ymir_todo (upstream triage_agent.py:1277-1299).
func IsTerminalLabel(label string) bool {
	switch label {
	case LabelTriageInProgress, LabelRebaseSibling, LabelRebaseWaitingSiblings, LabelTodo:
		return false
	}
	return slices.Contains(enumLabels, label)
}

// ResolutionLabel is the Jira label triage writes for a resolution ("" for error and
// unknown resolutions).
func ResolutionLabel(resolution string) string {
	switch resolution {
	case ResolutionRebase:
		return LabelTriagedRebase
	case ResolutionBackport:
		return LabelTriagedBackport
	case ResolutionRebuild:
		return LabelTriagedRebuild
	case ResolutionClarification:
		return LabelNeedsAttention
	case ResolutionOpenEnded:
		return LabelTriaged
	case ResolutionPostponed:
		return LabelTriagedPostponed
	case ResolutionNotAffected:
		return LabelTriagedNotAffected
	}
	return ""
}

// TriagedLabel is ymir_triaged_<agent>, the label that marks an issue waiting for (or
// being worked on by) a downstream agent.
func TriagedLabel(agent string) string { return "ymir_triaged_" + agent }

// DoneLabel is the label a downstream agent writes on success: ymir_rebased,
// ymir_backported, ymir_rebuilt.
func DoneLabel(agent string) string {
	switch agent {
	case "rebase":
		return LabelRebased
	case "backport":
		return LabelBackported
	case "rebuild":
		return LabelRebuilt
	}
	return ""
}

// FailedLabel is ymir_<agent>_failed, written on a clean failure of a user-triggered run
// that will be retried.
func FailedLabel(agent string) string { return "ymir_" + agent + "_failed" }

// ErroredLabel is ymir_<agent>_errored (ymir_triage_errored for triage), written when the
// retries are exhausted.
func ErroredLabel(agent string) string { return "ymir_" + agent + "_errored" }

// IsDispatched reports whether a resolution hands the issue to a downstream agent.
func IsDispatched(resolution string) bool {
	return resolution == ResolutionRebase || resolution == ResolutionBackport || resolution == ResolutionRebuild
}

// StreamBranch maps a target branch to the downstream agents' branch (upstream
// constants.py:116-156): c9s when the lowercased branch contains rhel-9, c9s, rhel-8
// or c8s, c10s otherwise.
func StreamBranch(targetBranch string) string {
	b := strings.ToLower(targetBranch)
	for _, s := range []string{"rhel-9", "c9s", "rhel-8", "c8s"} {
		if strings.Contains(b, s) {
			return "c9s"
		}
	}
	return "c10s"
}

// Dispatch is the routing table (upstream §5.2): the stream a triage resolution's
// downstream request goes to, or ok=false when nothing is dispatched (a resolution
// that is not rebase, backport or rebuild, or no target branch). User-triggered work
// goes to the :todo twin.
func Dispatch(topo pipeline.Topology, resolution, targetBranch string, userTriggered bool) (stream string, ok bool) {
	if !IsDispatched(resolution) || strings.TrimSpace(targetBranch) == "" {
		return "", false
	}
	return topo.Stream(resolution, StreamBranch(targetBranch), userTriggered), true
}
