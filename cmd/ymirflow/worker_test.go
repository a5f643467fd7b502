package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// docs/architecture.md, "Bad input": Redis unreachable at start → exit 1 with one clear line naming the URL,
// without its password; a bad setting → exit 2 naming it.
func TestWorkerStartErrors(t *testing.T) {
	t.Parallel()
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
	// Only settings given together may contradict each other (given alone, LOCK_TTL would
	// follow MAX_IDLE_TIME); the message names both.
	code = run(context.Background(), []string{"worker", "--agent", "triage", "--runner", "demo", "--redis-url", url,
		"--lock-ttl", "300s", "--max-idle-time", "30s"}, &out, &errs)
	if code != exitUsage || !strings.Contains(errs.String(), "MAX_IDLE_TIME") || !strings.Contains(errs.String(), "LOCK_TTL") {
		t.Fatalf("MAX_IDLE_TIME below the heartbeat: exit %d, stderr %q", code, errs.String())
	}
}

// Each duration setting of the worker, set alone (by its environment variable) to
// either end of its documented range, gives a worker that starts and stops cleanly:
// the lease settings it is related to follow it instead of refusing it.
func TestWorkerStartsWithEachDurationEndAlone(t *testing.T) {
	_, ns := redistest.Client(t)
	var names []string
	for name := range config.DurationRanges {
		if slices.Contains(config.EnvNamesOf("worker"), envOf(name)) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if len(names) < 8 {
		t.Fatalf("worker duration settings with a range: %v", names)
	}
	for _, name := range names {
		r := config.DurationRanges[name]
		for _, v := range []time.Duration{r.Min, r.Max} {
			t.Run(envOf(name)+"="+v.String(), func(t *testing.T) {
				for _, env := range config.EnvNamesOf("worker") {
					t.Setenv(env, "")
					if err := os.Unsetenv(env); err != nil {
						t.Fatal(err)
					}
				}
				t.Setenv(envOf(name), v.String())
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				errs := &testlog.Buffer{}
				code := make(chan int, 1)
				go func() {
					code <- run(ctx, []string{"worker", "--agent", "triage", "--runner", "demo", "--metrics-addr", "127.0.0.1:0",
						"--redis-url", redistest.URL(), "--ymir-namespace", ns + "ymir"}, io.Discard, errs)
				}()
				// Started means /readyz answers 200: Redis reachable and the router running.
				deadline := time.After(30 * time.Second)
				for !ready(errs.String()) {
					select {
					case c := <-code:
						t.Fatalf("%s=%s alone: exit %d before starting: %s", envOf(name), v, c, errs.String())
					case <-deadline:
						t.Fatalf("%s=%s alone: not started after 30s: %s", envOf(name), v, errs.String())
					case <-time.After(10 * time.Millisecond):
					}
				}
				cancel()
				select {
				case c := <-code:
					if c != 0 {
						t.Fatalf("%s=%s alone: exit %d: %s", envOf(name), v, c, errs.String())
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("%s=%s alone: no exit 60s after the signal", envOf(name), v)
				}
			})
		}
	}
}

func envOf(flagName string) string { return strings.ToUpper(strings.ReplaceAll(flagName, "-", "_")) }

var metricsAddrRe = regexp.MustCompile(`"metrics_addr":"([^"]+)"`)

// ready reports whether the worker whose log is log serves /readyz with 200.
func ready(log string) bool {
	m := metricsAddrRe.FindStringSubmatch(log)
	if m == nil {
		return false
	}
	resp, err := http.Get("http://" + m[1] + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
