package labels_test

import (
	"slices"
	"testing"

	"github.com/ymirflow/ymirflow/internal/labels"
)

// The derived names must be the enum's own, or a stage would write a label the fetcher
// and the triage dedup do not know.
func TestDerivedNamesAreTheEnums(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ got, want string }{
		{labels.TriagedFor("rebase"), labels.TriagedRebase},
		{labels.TriagedFor("backport"), labels.TriagedBackport},
		{labels.TriagedFor("rebuild"), labels.TriagedRebuild},
		{labels.DoneFor("rebase"), labels.Rebased},
		{labels.DoneFor("backport"), labels.Backported},
		{labels.DoneFor("rebuild"), labels.Rebuilt},
		{labels.DoneFor("triage"), ""},
		{labels.FailedFor("rebase"), labels.RebaseFailed},
		{labels.FailedFor("backport"), labels.BackportFailed},
		{labels.FailedFor("rebuild"), labels.RebuildFailed},
		{labels.ErroredFor("triage"), labels.TriageErrored},
		{labels.ErroredFor("rebase"), labels.RebaseErrored},
		{labels.ErroredFor("backport"), labels.BackportErrored},
		{labels.ErroredFor("rebuild"), labels.RebuildErrored},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	t.Parallel()
	for _, l := range []string{labels.TriagedRebase, labels.NeedsAttention, labels.Rebased, labels.TriageErrored,
		labels.CLITriage, labels.ReproducerInProgress, labels.RetryNeeded, labels.ConsolidateNext} {
		if !labels.IsTerminal(l) {
			t.Errorf("IsTerminal(%q) = false", l)
		}
	}
	// In flight, the maintainer's trigger, and anything outside the enum.
	for _, l := range []string{labels.TriageInProgress, labels.RebaseSibling, labels.RebaseWaitingSiblings, labels.Todo,
		"ymir_legacy_thing", "cve", ""} {
		if labels.IsTerminal(l) {
			t.Errorf("IsTerminal(%q) = true", l)
		}
	}
}

func TestYmirAndInFlight(t *testing.T) {
	t.Parallel()
	if got := labels.Ymir([]string{"cve", "ymir_todo", "Ymir_x", "ymir_legacy"}); !slices.Equal(got, []string{"ymir_todo", "ymir_legacy"}) {
		t.Errorf("Ymir = %v", got)
	}
	want := []string{"ymir_triage_in_progress", "ymir_triaged_backport", "ymir_triaged_rebase", "ymir_triaged_rebuild",
		"ymir_cli_triage", "ymir_reproducer_in_progress"}
	in := labels.InFlight()
	if !slices.Equal(in, want) {
		t.Errorf("InFlight = %v, want %v", in, want)
	}
	in[0] = "changed"
	if labels.InFlight()[0] != want[0] {
		t.Error("InFlight shares its slice with callers")
	}
}
