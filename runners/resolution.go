package runners

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

// IsDispatched reports whether a resolution hands the issue to a downstream agent.
func IsDispatched(resolution string) bool {
	return resolution == ResolutionRebase || resolution == ResolutionBackport || resolution == ResolutionRebuild
}
