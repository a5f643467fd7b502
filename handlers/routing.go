package handlers

import (
	"strings"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/runners"
)

// ResolutionLabel is the Jira label triage writes for a resolution ("" for error and
// unknown resolutions).
func ResolutionLabel(resolution string) string {
	switch resolution {
	case runners.ResolutionRebase:
		return labels.TriagedRebase
	case runners.ResolutionBackport:
		return labels.TriagedBackport
	case runners.ResolutionRebuild:
		return labels.TriagedRebuild
	case runners.ResolutionClarification:
		return labels.NeedsAttention
	case runners.ResolutionOpenEnded:
		return labels.Triaged
	case runners.ResolutionPostponed:
		return labels.TriagedPostponed
	case runners.ResolutionNotAffected:
		return labels.TriagedNotAffected
	}
	return ""
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
func Dispatch(topo event.Topology, resolution, targetBranch string, userTriggered bool) (stream string, ok bool) {
	if !runners.IsDispatched(resolution) || strings.TrimSpace(targetBranch) == "" {
		return "", false
	}
	return topo.Stream(resolution, StreamBranch(targetBranch), userTriggered), true
}
