package handlers

import (
	"strings"

	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Resolutions a triage runner may return (the Python agents' Resolution enum).
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

// ResolutionLabel is the Jira label triage writes for a resolution ("" for error and
// unknown resolutions).
func ResolutionLabel(resolution string) string {
	switch resolution {
	case ResolutionRebase:
		return labels.TriagedRebase
	case ResolutionBackport:
		return labels.TriagedBackport
	case ResolutionRebuild:
		return labels.TriagedRebuild
	case ResolutionClarification:
		return labels.NeedsAttention
	case ResolutionOpenEnded:
		return labels.Triaged
	case ResolutionPostponed:
		return labels.TriagedPostponed
	case ResolutionNotAffected:
		return labels.TriagedNotAffected
	}
	return ""
}

// IsDispatched reports whether a resolution hands the issue to a downstream agent.
func IsDispatched(resolution string) bool {
	return resolution == ResolutionRebase || resolution == ResolutionBackport || resolution == ResolutionRebuild
}

// StreamBranch maps a target branch to the downstream agents' branch, as the Python
// agents do: c9s when the lowercased branch contains rhel-9, c9s, rhel-8
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

// Dispatch is the routing table (docs/architecture.md, "The routing table"): the stream a triage resolution's
// downstream request goes to, or ok=false when nothing is dispatched (a resolution
// that is not rebase, backport or rebuild, or no target branch). User-triggered work
// goes to the :todo twin.
func Dispatch(topo pipeline.Topology, resolution, targetBranch string, userTriggered bool) (stream string, ok bool) {
	if !IsDispatched(resolution) || strings.TrimSpace(targetBranch) == "" {
		return "", false
	}
	return topo.Stream(resolution, StreamBranch(targetBranch), userTriggered), true
}
