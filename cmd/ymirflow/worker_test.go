package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// DESIGN §6: Redis unreachable at start → exit 1 with one clear line naming the URL,
// without its password; a bad setting → exit 2 naming it.
func TestWorkerStartErrors(t *testing.T) {
	port := redistest.FreePort(t)
	url := "redis://admin:hunter2@127.0.0.1:" + strconv.Itoa(port) + "/0"
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"worker", "--agent", "triage", "--runner", "demo", "--metrics-addr", "",
		"--redis-url", url}, &out, &errs)
	lines := strings.Split(strings.TrimSpace(errs.String()), "\n")
	if code != exitRuntime || strings.Contains(errs.String(), "hunter2") ||
		!strings.Contains(lines[len(lines)-1], "127.0.0.1:"+strconv.Itoa(port)) {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}

	errs.Reset()
	code = run(context.Background(), []string{"worker", "--agent", "triage", "--runner", "demo", "--lock-ttl", "-5s"}, &out, &errs)
	if code != exitUsage || !strings.Contains(errs.String(), "LOCK_TTL") {
		t.Fatalf("negative TTL: exit %d, stderr %q", code, errs.String())
	}
	errs.Reset()
	code = run(context.Background(), []string{"worker", "--agent", "triage", "--runner", "demo", "--max-idle-time", "30s"}, &out, &errs)
	if code != exitUsage || !strings.Contains(errs.String(), "MAX_IDLE_TIME") {
		t.Fatalf("MAX_IDLE_TIME below the heartbeat: exit %d, stderr %q", code, errs.String())
	}
}
