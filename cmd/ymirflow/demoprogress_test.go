package main

import (
	"context"
	"regexp"
	"testing"

	"github.com/ymirflow/ymirflow/internal/testlog"
)

// Issue 35 (low): the demo's last progress line agrees with its summary. Plain progress
// lines come at most once a second, and the last snapshot, taken when the pipeline had
// drained, was never printed when it came sooner.
func TestDemoLastProgressLineAgreesWithSummary(t *testing.T) {
	logFile := demoEnv(t) // not parallel: the settings come from the environment too
	var out, errb testlog.Buffer
	if code := run(context.Background(), []string{"demo", "--issues", "20", "--speed", "20ms", "--log-file", logFile}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	progress := regexp.MustCompile(`(?m)^ *[0-9.]+s  published (\d+), running 0, succeeded \d+, failed \d+, dropped (\d+), retried (\d+), dead (\d+)$`)
	lines := progress.FindAllStringSubmatch(out.String(), -1)
	done := regexp.MustCompile(`Done in \S+: (\d+) events published, \d+ run, (\d+) dropped by the lock, \d+ delivered to a running agent, (\d+) retries, (\d+) dead\.`).
		FindStringSubmatch(out.String())
	if len(lines) == 0 || done == nil {
		t.Fatalf("no progress line with nothing running, or no summary:\n%s", out.String())
	}
	last := lines[len(lines)-1]
	for i, what := range []string{"published", "dropped", "retried", "dead"} {
		if last[i+1] != done[i+1] {
			t.Errorf("the last progress line says %s %s, the summary %s:\n%s", what, last[i+1], done[i+1], out.String())
		}
	}
}
