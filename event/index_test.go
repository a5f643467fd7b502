package event_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/event"
)

// An issue index is named after a key only when the key is one: each invalid key of
// docs/architecture.md, "Bad input", goes to event.InvalidIssue, an empty one to no
// index (issue 35).
func TestIndexIssueNeverNamesABadKey(t *testing.T) {
	t.Parallel()
	refuse := func(raw string) (string, error) {
		if raw == " rhel-7 " {
			return "RHEL-7", nil
		}
		return "", errors.New("invalid issue key")
	}
	for raw, want := range map[string]string{
		"":                              "",
		"  ":                            "",
		" rhel-7 ":                      "RHEL-7",
		"../x":                          event.InvalidIssue,
		"../ETC/PASSWD":                 event.InvalidIssue,
		"RHEL 12":                       event.InvalidIssue,
		strings.Repeat("A", 296) + "-1": event.InvalidIssue,
		"RHEL-1\a":                      event.InvalidIssue,
		"RHEL-1\n../x":                  event.InvalidIssue,
		"{ymir:dead}":                   event.InvalidIssue,
	} {
		if got := event.IndexIssue(raw); got != want {
			t.Errorf("IndexIssue(%q) = %q, want %q", raw, got, want)
		}
		if got := event.IndexIssueOf(raw, refuse); got != want {
			t.Errorf("IndexIssueOf(%q) = %q, want %q", raw, got, want)
		}
	}
	// A key of safe characters that the lease's pattern refuses is invalid where the
	// pattern is at hand.
	if got := event.IndexIssueOf("RHEL-0", refuse); got != event.InvalidIssue {
		t.Errorf("IndexIssueOf(RHEL-0) = %q", got)
	}
}
