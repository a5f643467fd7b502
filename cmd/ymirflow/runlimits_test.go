package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/testlog"
)

// TestWorkerRunLimitsValidated: a bad RUN_LIMITS stops the worker at start-up, the
// error naming the setting.
func TestWorkerRunLimitsValidated(t *testing.T) {
	for _, bad := range []string{"rebase=0", "field:a+b=1", "weight:kernel=2"} {
		errs := &testlog.Buffer{}
		code := run(context.Background(), []string{"worker", "--agent", "rebase", "--branch", "c9s", "--runner", "demo",
			"--run-limits", bad}, io.Discard, errs)
		if code != 2 || !strings.Contains(errs.String(), "RUN_LIMITS") {
			t.Errorf("--run-limits %q: exit %d, %s; want 2 naming RUN_LIMITS", bad, code, errs.String())
		}
	}
}
