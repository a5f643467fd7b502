package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// A worker with REQUIRE_AOF refuses to start on a Redis that keeps no append-only file
// (its restart would hand fences out again): exit 2 naming the setting and why.
func TestWorkerRequireAOFRefusesARedisWithoutIt(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"worker", "--agent", "triage", "--runner", "demo", "--metrics-addr", "",
		"--redis-url", srv.URL(), "--require-aof"}, &out, &errs)
	if code != exitUsage || !strings.Contains(errs.String(), "REQUIRE_AOF") || !strings.Contains(errs.String(), "persists nothing") {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}
}
