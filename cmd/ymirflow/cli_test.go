package main

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// Issue 29: the filters and modes of an operator command are flags only. Variables left
// in the shell (AGENT=triage after starting a worker by environment, ISSUE, JSON,
// ASSUME_YES) change nothing a view shows, and an empty view names the filters in force.
func TestFiltersAreFlagsNotEnvironment(t *testing.T) {
	o := newOpsEnv(t)
	id := o.publish(o.stream("backport", "c9s"), "RHEL-7")
	o.read(o.stream("backport", "c9s"), o.topo.Group("backport", "c9s"), "pod-b")
	o.acquire("backport", "RHEL-7", "pod-b", id)
	for k, v := range map[string]string{"AGENT": "triage", "ISSUE": "RHEL-1", "BRANCH": "c10s", "JSON": "true",
		"ASSUME_YES": "true", "YES": "true", "STREAM": "triage", "DRY_RUN": "true", "ALL": "true", "BEFORE": "1-0"} {
		t.Setenv(k, v)
	}

	out, errs, code := o.run("locks")
	if code != exitOK || !strings.Contains(out, "RHEL-7") || !strings.Contains(out, "backport") || strings.HasPrefix(out, "{") {
		t.Fatalf("locks with AGENT=triage ISSUE=RHEL-1 JSON=true in the environment: exit %d\n%s%s", code, out, errs)
	}
	if out := o.ok("pending"); !strings.Contains(out, "RHEL-7") || !strings.Contains(out, "pod-b") {
		t.Fatalf("pending with ISSUE=RHEL-1 BRANCH=c10s in the environment:\n%s", out)
	}
	// ASSUME_YES does not answer a question.
	withStdin(t, "", false)
	if errs := o.code(exitUsage, "locks", "release", "backport", "RHEL-7", "--reason", "a test"); !strings.Contains(errs, "--yes") || strings.Contains(errs, "ASSUME_YES") {
		t.Fatalf("locks release with ASSUME_YES=true: %s", errs)
	}

	// Empty results say what was looked at, on stderr.
	out, errs, code = o.run("locks", "--agent", "triage", "--issue", "RHEL-1")
	if code != exitOK || !strings.Contains(out, "no live leases") ||
		!strings.Contains(errs, "--agent triage") || !strings.Contains(errs, "--issue RHEL-1") || !strings.Contains(errs, o.topo.Namespace) {
		t.Fatalf("empty locks: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
	}
	out, errs, _ = o.run("pending", "--issue", "RHEL-9")
	if !strings.Contains(out, "no pending entries") || !strings.Contains(errs, "--issue RHEL-9") {
		t.Fatalf("empty pending:\nstdout: %s\nstderr: %s", out, errs)
	}
	out, errs, _ = o.run("dlq", "list", "--issue", "RHEL-9")
	if !strings.Contains(out, "no dead letters") || !strings.Contains(errs, "--issue RHEL-9") {
		t.Fatalf("empty dlq list:\nstdout: %s\nstderr: %s", out, errs)
	}
	if _, errs, _ := o.run("history", "RHEL-9"); !strings.Contains(errs, "no filters") {
		t.Fatalf("empty history: stderr %s", errs)
	}
	// --help says which flags no variable sets.
	if out := o.ok("locks", "--help"); !strings.Contains(out, "--agent string") || !strings.Contains(out, "(flag only)") || strings.Contains(out, "$AGENT") {
		t.Fatalf("locks --help:\n%s", out)
	}
}

// Issue 29: one help style. Every command's --help (and `help CMD`) prints a usage line,
// a description and its settings on stdout and exits 0; an unknown flag gets the usage
// line and the nearest flag, exit 2, in a few lines.
func TestEveryCommandHasOneHelpStyle(t *testing.T) {
	newOpsEnv(t)
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			out, errs, code := runArgs(c.name, "--help")
			if code != exitOK || errs != "" || !strings.HasPrefix(out, "Usage: ymirflow "+c.name) || !strings.Contains(out, "\n\nFlags") {
				t.Fatalf("%s --help: exit %d\nstdout: %s\nstderr: %s", c.name, code, out, errs)
			}
			if len(strings.TrimSpace(c.help)) < 80 {
				t.Errorf("%s: description too short: %q", c.name, c.help)
			}
			if h, _, code := runArgs("help", c.name); code != exitOK || h != out {
				t.Errorf("help %s: exit %d, not the same as %s --help:\n%s", c.name, code, c.name, h)
			}
			_, errs, code = runArgs(c.name, "--no-such-flag")
			lines := strings.Split(strings.TrimSpace(errs), "\n")
			if code != exitUsage || !strings.Contains(errs, "unknown flag --no-such-flag") || !strings.Contains(errs, "Usage: ymirflow "+c.name) || len(lines) > 4 {
				t.Errorf("%s --no-such-flag: exit %d\n%s", c.name, code, errs)
			}
		})
	}
	if _, errs, code := runArgs("worker", "--agent"); code != exitUsage || !strings.Contains(errs, "needs an argument: --agent") {
		t.Errorf("worker --agent (no value): exit %d\n%s", code, errs)
	}
	_, errs, code := runArgs("worker", "--agnet", "triage")
	if code != exitUsage || !strings.Contains(errs, "did you mean --agent?") {
		t.Fatalf("worker --agnet: exit %d\n%s", code, errs)
	}
	_, errs, _ = runArgs("locks", "--isue", "RHEL-1")
	if !strings.Contains(errs, "did you mean --issue?") {
		t.Fatalf("locks --isue: %s", errs)
	}
	out, _, _ := runArgs("worker", "--help")
	for _, want := range []string{"LOCK_TTL", "LOCK_MAX_HOLD", "[required] agent to run", "[required with --runner exec]"} {
		if !strings.Contains(out, want) {
			t.Errorf("worker --help lacks %q", want)
		}
	}
	if out, _, _ := runArgs("enqueue", "--help"); !strings.Contains(out, "KEY...") {
		t.Errorf("enqueue --help does not name its arguments:\n%s", out)
	}
	if _, errs, code := runArgs("help", "nope"); code != exitUsage || !strings.Contains(errs, `unknown command "nope"`) {
		t.Errorf("help nope: exit %d\n%s", code, errs)
	}
}

// Issue 29, the smaller messages: each says what a valid value looks like.
func TestMessagesGiveAValidExample(t *testing.T) {
	newOpsEnv(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"locks", "--redis-url", "127.0.0.1:6379"}, []string{"REDIS_URL", "no scheme", "redis://127.0.0.1:6379/0"}},
		{[]string{"locks", "--redis-url", "localhost:6379/2"}, []string{"redis://localhost:6379/2"}},
		{[]string{"locks", "--redis-url", "http://h:6379"}, []string{"redis://host:6379/0"}},
		{[]string{"fetch", "--jira-url", "jira.example.com"}, []string{"JIRA_URL", "no scheme", "https://"}},
		{[]string{"worker", "--agent", "triage", "--runner", "demo", "--lock-ttl", "300"}, []string{"LOCK_TTL (--lock-ttl)", `"300" is not a duration`, "300s"}},
		{[]string{"worker", "--agent", "triage", "--runner", "demo", "--dry-run=maybe"}, []string{"DRY_RUN (--dry-run)", "not a boolean", "true or false"}},
		{[]string{"worker", "--agent", "triage", "--runner", "demo", "--concurrency", "two"}, []string{"CONCURRENCY", "whole number"}},
		{[]string{"locks", "--json=yes"}, []string{"--json", "not a boolean"}},
		{[]string{"history", "RHEL 1"}, []string{`"RHEL 1" is not an issue key`, "e.g. RHEL-123"}},
		{[]string{"history", "../x"}, []string{`"../x" is not an issue key`}},
		{[]string{"enqueue", "RHEL-1", "x y"}, []string{`"x y" is not an issue key`}},
		{[]string{"locks", "--issue", "a/b"}, []string{`"a/b" is not an issue key`}},
	} {
		_, errs, code := runArgs(c.args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", c.args, code, exitUsage, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%v: message lacks %q:\n%s", c.args, w, errs)
			}
		}
		for _, never := range []string{"parse error", "lockmw:", "lease:", "^[", "<unparseable URL>"} {
			if strings.Contains(errs, never) {
				t.Errorf("%v: message has %q:\n%s", c.args, never, errs)
			}
		}
	}
	// Redis unreachable: quick (no dial retries), names REDIS_URL and the URL tried.
	t.Setenv("REDIS_URL", "redis://127.0.0.1:"+strconv.Itoa(redistest.FreePort(t))+"/15")
	start := time.Now()
	_, errs, code := runArgs("locks")
	took := time.Since(start)
	if code != exitRuntime || !strings.Contains(errs, "REDIS_URL") || !strings.Contains(errs, "redis unreachable") ||
		!strings.Contains(errs, "127.0.0.1:") || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
		t.Fatalf("Redis down: exit %d\n%s", code, errs)
	}
	if took > 500*time.Millisecond {
		t.Errorf("Redis down: the message took %v (want well under a second: no dial retries at start)", took)
	}
}

// A Redis that answers PING with an error is up: the message names the cause and
// REDIS_URL, never "unreachable" nor advice to start a server (issue 35).
func TestRedisRefusalNamesTheCause(t *testing.T) {
	// Not parallel: it sets REDIS_URL and runs a redis-server of its own.
	shared, err := url.Parse(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	shared.Path = "/99"
	s := redistest.StartServer(t, redistest.ServerOptions{})
	if err := s.Client().ConfigSet(context.Background(), "requirepass", "sekrit").Err(); err != nil {
		t.Fatal(err)
	}
	for redisURL, want := range map[string][]string{
		shared.String():                       {"redis has no such database", "no database 99", "REDIS_URL's path is the database"},
		"redis://:hunter2@" + s.Addr() + "/0": {"redis refused the credentials", "WRONGPASS", "redis://USER:PASSWORD@host:port/db"},
		"redis://" + s.Addr() + "/0":          {"redis refused the credentials", "NOAUTH"},
		"redis://:sekrit@" + s.Addr() + "/16": {"no database 16"},
	} {
		t.Setenv("REDIS_URL", redisURL)
		_, errs, code := runArgs("locks")
		if code != exitRuntime || !strings.HasPrefix(errs, "ymirflow locks: REDIS_URL (--redis-url): ") || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
			t.Errorf("%s: exit %d, want %d and one line naming REDIS_URL:\n%s", redisURL, code, exitRuntime, errs)
		}
		for _, w := range want {
			if !strings.Contains(errs, w) {
				t.Errorf("%s: message lacks %q:\n%s", redisURL, w, errs)
			}
		}
		for _, never := range []string{"unreachable", "start a server", "hunter2", "sekrit"} {
			if strings.Contains(errs, never) {
				t.Errorf("%s: message says %q:\n%s", redisURL, never, errs)
			}
		}
	}
}

// A listen address in use is one line naming its setting (variable and flag) and the
// address once, not net's message with the address twice (issue 35).
func TestPortClashNamesTheSetting(t *testing.T) {
	// Not parallel: it sets REDIS_URL.
	_, ns := redistest.Client(t)
	t.Setenv("REDIS_URL", redistest.URL())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	for _, c := range []struct {
		args    []string
		setting string
	}{
		{[]string{"web", "--addr", addr, "--ymir-namespace", ns + "ymir"}, "WEB_ADDR (--addr) = "},
		{[]string{"worker", "--agent", "triage", "--runner", "demo", "--metrics-addr", addr, "--ymir-namespace", ns + "ymir"}, "METRICS_ADDR (--metrics-addr) = "},
		{[]string{"fakejira", "--addr", addr}, "ADDR (--addr) = "},
	} {
		_, all, code := runArgs(c.args...)
		// The message is one line; the worker's structured log lines before it (e.g.
		// the warning that the test Redis persists nothing) are not part of it.
		var lines []string
		for _, l := range strings.Split(all, "\n") {
			if !strings.HasPrefix(l, "{") {
				lines = append(lines, l)
			}
		}
		errs := strings.Join(lines, "\n")
		want := "ymirflow " + c.args[0] + ": " + c.setting + addr + ": cannot listen: bind: address already in use (another process listens there"
		if code != exitUsage || !strings.HasPrefix(errs, want) || strings.Count(errs, addr) != 1 || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
			t.Errorf("%v: exit %d, want %d and one line starting %q:\n%s", c.args, code, exitUsage, want, errs)
		}
	}
}

// A bad issue key reads the same in the CLI as in the console: inspect.BadKey's
// sentence (issue 35).
func TestBadKeysReadAsInTheConsole(t *testing.T) {
	o := newOpsEnv(t)
	for _, key := range []string{"RHEL 1", "../x", strings.Repeat("A", 298) + "-1"} {
		for _, args := range [][]string{{"history", key}, {"pending", "--issue", key}, {"dlq", "list", "--issue", key}, {"locks", "--issue", key}} {
			errs := o.code(exitUsage, args...)
			if !strings.HasSuffix(errs, inspect.BadKey(key)+"\n") || strings.Count(errs, "\n") != 1 {
				t.Errorf("%q: %q, want one line ending %q", args, errs, inspect.BadKey(key))
			}
		}
	}
}

// A stream nobody consumes (no group: no worker of its agent ever started) says how
// many events wait for that worker, in pending as in streams (issue 35).
func TestStreamWithoutGroupSaysEventsWait(t *testing.T) {
	o := newOpsEnv(t)
	o.publish(o.stream("backport", "c9s"), "RHEL-3")
	o.publish(o.stream("backport", "c9s"), "RHEL-4")
	for _, cmd := range []string{"pending", "streams"} {
		if out := o.ok(cmd); !strings.Contains(out, o.stream("backport", "c9s")) || !strings.Contains(out, "2 events wait for a worker that does not exist") {
			t.Errorf("%s:\n%s", cmd, out)
		}
	}
	var rep inspect.PendingReport
	o.json(&rep, "pending", "--agent", "backport")
	if len(rep.Groups) != 1 || !rep.Groups[0].NoGroup || rep.Groups[0].Waiting != 2 {
		t.Errorf("pending --json: %+v", rep)
	}
}

// runArgs runs `ymirflow args...` in-process and returns its stdout, stderr and exit code.
func runArgs(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

// Issue 35: a port clash in dev names dev's own setting (--web-addr), once, not the flag
// of the component that would have failed to listen (web's --addr).
func TestDevPortClashNamesDevsSetting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	free := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	_, errs, code := runArgs("dev", "--embedded-redis-addr", free, "--web-addr", addr, "--log-dir", t.TempDir())
	want := "ymirflow dev: WEB_ADDR (--web-addr) = " + addr + ": cannot listen: bind: address already in use"
	if code != exitUsage || !strings.HasPrefix(errs, want) || strings.Count(errs, addr) != 1 {
		t.Fatalf("dev with --web-addr taken: exit %d, want %d and %q:\n%s", code, exitUsage, want, errs)
	}
}
