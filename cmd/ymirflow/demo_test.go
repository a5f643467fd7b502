package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/demo"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

func demoEnv(t *testing.T) string {
	t.Helper()
	for name := range config.EnvNames() {
		t.Setenv(name, "") // nothing leaks in from the environment
	}
	return filepath.Join(t.TempDir(), "demo.log")
}

func TestDemoCommand(t *testing.T) {
	logFile := demoEnv(t)
	var out, errb testlog.Buffer
	code := run(context.Background(), []string{"demo", "--issues", "20", "--speed", "20ms", "--log-file", logFile}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	o := out.String()
	for _, want := range []string{"ymirflow demo: 20 issues", "embedded Redis (miniredis)", "sweep 1: found 20", "sweep 2: found 20, published 0",
		"Done in", "published  run  dropped  delivered  retried  succeeded  failed  dead", "backport-c10s", "total",
		"ok     follow-ups: 1 of 1 maintainer comments made during a run reached the running agent",
		"Jira labels as planned for 20 of 20 issues", "ymirflow history RHEL-", "Logs of every worker: " + logFile} {
		if !strings.Contains(o, want) {
			t.Errorf("output lacks %q:\n%s", want, o)
		}
	}
	if strings.Contains(o, "\x1b[") {
		t.Errorf("escape codes in output that is not a terminal:\n%q", o)
	}
	if strings.Contains(o, "NOT OK") {
		t.Errorf("a check failed:\n%s", o)
	}
	if b, err := os.ReadFile(logFile); err != nil || !bytes.Contains(b, []byte(`"message":"triage done"`)) {
		t.Errorf("log file %s: %v, %d bytes without the workers' lines", logFile, err, len(b))
	}
}

func TestDemoCommandJSONOnRealRedis(t *testing.T) {
	logFile := demoEnv(t)
	redistest.Client(t)
	t.Setenv("REDIS_URL", redistest.URL())
	var out, errb testlog.Buffer
	code := run(context.Background(), []string{"demo", "--issues", "14", "--speed", "0s", "--json", "--log-file", logFile}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	var s demo.Summary
	if err := json.Unmarshal([]byte(out.String()), &s); err != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", err, out.String())
	}
	if !s.Complete() || s.Embedded || !strings.HasPrefix(s.Namespace, "ymir-demo-") || s.Issues != 14 {
		t.Errorf("summary: complete %v, embedded %v, namespace %q, issues %d", s.Complete(), s.Embedded, s.Namespace, s.Issues)
	}
	if s.Total.Dropped != s.Duplicates.Count() || s.Total.Published != s.Total.Run+s.Total.Dropped+s.Total.Delivered ||
		s.Total.Delivered != 1 || len(s.Followups) != 1 || !s.Followups[0].Delivered() || len(s.Stages) != 7 {
		t.Errorf("totals: %+v, duplicates %d", s.Total, s.Duplicates.Count())
	}
	if !strings.Contains(errb.String(), "sweep 1: found 14") {
		t.Errorf("progress does not go to stderr with --json:\n%s", errb.String())
	}
}

func TestDemoCommandInterrupted(t *testing.T) {
	logFile := demoEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb testlog.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--speed", "300ms", "--log-file", logFile}, &out, &errb)
	}()
	waitOut(t, &out, &errb, regexp.MustCompile(`(workers:)`))
	// Ctrl-C a moment into the run (one --speed step), not before anything happened: the
	// pause is the scenario, the test holds whatever the demo did by then.
	time.Sleep(300 * time.Millisecond)
	cancel() // as SIGINT does through signal.NotifyContext
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after Ctrl-C, want 0\n%s%s", code, out.String(), errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the demo did not stop within 10s of Ctrl-C")
	}
	if !strings.Contains(out.String(), "Interrupted after") {
		t.Errorf("no line saying it was interrupted:\n%s", out.String())
	}
}

func TestDemoCommandUsage(t *testing.T) {
	demoEnv(t)
	for _, args := range [][]string{{"--speed", "fast"}, {"--issues", "0"}, {"extra"}, {"--redis-url", "redis://a:1,b:2/0"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"demo"}, args...), &out, &errb); code != exitUsage {
			t.Errorf("demo %v: exit %d, want %d\n%s", args, code, exitUsage, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"demo", "--help"}, &out, &errb); code != exitOK {
		t.Errorf("demo --help: exit %d\n%s", code, errb.String())
	}
}
