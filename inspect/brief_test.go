package inspect_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ymirflow/ymirflow/inspect"
)

// agentFailure is a runner's error as a dead letter keeps it: what failed, then the
// agent's stderr, whose last line says why.
func agentFailure() string {
	var b strings.Builder
	b.WriteString("exec runner: exit status 1; stderr: ")
	for i := range 60 {
		b.WriteString("INFO step " + strings.Repeat("é", i%5) + " cloning and building the package\n")
	}
	b.WriteString("FATAL: patch 0003 does not apply to c10s")
	return b.String()
}

// A long error shows what failed and the end of the agent's stderr (its failure line),
// not the head of the stderr; a short one is shown whole, on one line.
func TestErrorBriefKeepsTheStartAndTheEnd(t *testing.T) {
	t.Parallel()
	for _, n := range []int{100, 240} {
		got := inspect.ErrorBrief(agentFailure(), n)
		if !strings.HasPrefix(got, "exec runner: exit status 1; stderr: …") || !strings.HasSuffix(got, "FATAL: patch 0003 does not apply to c10s") ||
			utf8.RuneCountInString(got) != n || strings.Contains(got, "\n") {
			t.Errorf("ErrorBrief(_, %d) = %q (%d characters)", n, got, utf8.RuneCountInString(got))
		}
	}
	if got := inspect.ErrorBrief("runner exited 1:\n  bad  JSON", 100); got != "runner exited 1: bad JSON" {
		t.Errorf("short error: %q", got)
	}
	long := strings.Repeat("handler: ", 30) + "the root cause"
	if got := inspect.ErrorBrief(long, 60); !strings.HasPrefix(got, "handler: ") || !strings.HasSuffix(got, "the root cause") ||
		utf8.RuneCountInString(got) != 60 {
		t.Errorf("without a stderr: %q", got)
	}
}
