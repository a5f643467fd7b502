package runners_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/runners"
)

func runReq(t *testing.T, agent string) runners.RunRequest {
	t.Helper()
	payload := []byte(`{"metadata":{"issue":"RHEL-5","extra":[1,2]},"attempts":0,"user_triggered":true,"x":"y"}`)
	task, err := event.ParseTask(payload)
	if err != nil {
		t.Fatal(err)
	}
	return runners.RunRequest{Agent: agent, Branch: "", IssueKey: "RHEL-5", Fence: 42, Attempt: 2, MessageID: "1700000000000-3",
		Stream: "ymir:triage:todo", UserTriggered: true, Payload: payload, Task: task}
}

func TestExecRunnerContract(t *testing.T) {
	// Not parallel: it sets the process environment (t.Setenv), which Go refuses in a parallel test.
	dir := t.TempDir()
	t.Setenv("FROM_WORKER", "inherited")
	t.Setenv("OUT", dir)
	t.Setenv("NOT_LISTED", "kept back")
	t.Setenv("REDIS_URL", "redis://ymir:redis-pass@127.0.0.1:6379/0")
	t.Setenv("JIRA_TOKEN", "jira-token-value")
	t.Setenv("JIRA_URL", "https://jira.example.com")
	t.Setenv("YMIR_NAMESPACE", "inherited-ns")
	// JIRA_* passes JIRA_URL, never ymirflow's own Jira credentials (only when named);
	// REDIS_* never passes REDIS_URL.
	agentEnv := runners.BuildAgentEnv(os.Environ(), binaryPolicy("FROM_*", "OUT", "JIRA_*", "REDIS_*"))
	r := runners.ExecRunner{
		Command: `cat > "$OUT/stdin.json"; env | sort > "$OUT/env"; ` +
			`echo "progress: thinking" ; echo "to stderr" >&2; ` +
			`echo '{"resolution":"backport","target_branch":"rhel-9.6.0","data":{"package":"p"},"dist_git_namespace":"rpms"}'`,
		Env: agentEnv.Env,
	}
	req := runReq(t, "triage")
	res, err := r.Run(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Resolution != "backport" || res.TargetBranch != "rhel-9.6.0" || string(res.Data) != `{"package":"p"}` ||
		string(res.Extra["dist_git_namespace"]) != `"rpms"` {
		t.Fatalf("result %+v", res)
	}
	stdin, _ := os.ReadFile(filepath.Join(dir, "stdin.json"))
	if !bytes.Equal(stdin, req.Payload) {
		t.Fatalf("stdin %q, want the payload as received", stdin)
	}
	env, _ := os.ReadFile(filepath.Join(dir, "env"))
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(env)), "\n") {
		name, _, _ := strings.Cut(line, "=")
		switch name {
		case "PATH", "HOME", "LANG", "TZ", "TMPDIR":
			if os.Getenv(name) == "" {
				t.Errorf("%s passed but the worker has none", name)
			}
		case "PWD", "SHLVL", "_", "OLDPWD": // the shell's own
		default:
			got = append(got, line)
		}
	}
	want := []string{"FROM_WORKER=inherited", "JIRA_ISSUE=RHEL-5", "JIRA_URL=https://jira.example.com", "OUT=" + dir,
		"YMIR_AGENT=triage", "YMIR_ATTEMPT=2", "YMIR_BRANCH=",
		"YMIR_FENCE=42", "YMIR_ISSUE_KEY=RHEL-5", "YMIR_MESSAGE_ID=1700000000000-3", "YMIR_STREAM=ymir:triage:todo",
		"YMIR_USER_TRIGGERED=true"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("environment:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(agentEnv.Credentials) != 0 || len(agentEnv.Secrets) != 0 {
		t.Fatalf("a glob passed credentials: %+v", agentEnv)
	}
}

// ymirflow's own Jira credentials pass only when named, and are reported; secret-looking
// names are reported for redaction; REDIS_URL never passes.
func TestBuildAgentEnvExplicitCredentials(t *testing.T) {
	t.Parallel()
	environ := []string{"PATH=/bin", "JIRA_TOKEN=jt-1234", "GITLAB_TOKEN=gl-5678", "ANTHROPIC_API_KEY=ak-9999",
		"ANTHROPIC_MODEL=m", "REDIS_URL=redis://:pw@h", "OTHER=x"}
	e := runners.BuildAgentEnv(environ, binaryPolicy("JIRA_TOKEN", "GITLAB_TOKEN", "ANTHROPIC_*", "REDIS_URL"))
	want := "PATH=/bin JIRA_TOKEN=jt-1234 GITLAB_TOKEN=gl-5678 ANTHROPIC_API_KEY=ak-9999 ANTHROPIC_MODEL=m"
	if got := strings.Join(e.Env, " "); got != want {
		t.Fatalf("env %q, want %q", got, want)
	}
	if strings.Join(e.Credentials, ",") != "JIRA_TOKEN" || strings.Join(e.Secrets, ",") != "jt-1234,gl-5678,ak-9999" {
		t.Fatalf("reported %+v", e)
	}
	if e := runners.BuildAgentEnv(environ, binaryPolicy()); strings.Join(e.Env, " ") != "PATH=/bin" {
		t.Fatalf("no RUNNER_ENV: %q", e.Env)
	}
}

// binaryPolicy is the policy the ymirflow binary builds (cmd/ymirflow/config,
// Worker.AgentEnvPolicy, which its own test holds to these lists), passing pass.
func binaryPolicy(pass ...string) runners.EnvPolicy {
	return runners.EnvPolicy{Pass: pass, Credentials: []string{"JIRA_TOKEN", "JIRA_TOKEN_FILE", "JIRA_EMAIL"},
		Withheld: []string{"REDIS_URL", "REDISCLI_AUTH"}}
}

// The stderr tail in the error and the log passes the redactor.
func TestExecRunnerRedactsStderr(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	r := runners.ExecRunner{Command: `echo "token=$SECRET_TOKEN" >&2; exit 3`, Env: []string{"SECRET_TOKEN=s3cr3t-value"},
		Redactor: redact.New("s3cr3t-value"), Logger: zerolog.New(&log)}
	_, err := r.Run(context.Background(), runReq(t, "rebase"))
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "token=[redacted]") {
		t.Fatalf("error %v", err)
	}
	if strings.Contains(log.String(), "s3cr3t") || !strings.Contains(log.String(), "[redacted]") {
		t.Fatalf("log %s", log.String())
	}
}

// Credential shapes that nobody configured (a token the agent printed) are masked in the
// stderr tail of the error and the log, as in a Jira comment's text (issue 35).
func TestExecRunnerMasksCredentialShapesInStderr(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	token := "ghp_" + strings.Repeat("a1B2", 8)
	r := runners.ExecRunner{Command: `echo "push failed: https://bot:hunter2hunter2@gitlab.example/x.git password=letmein99 ` + token + `" >&2; exit 1`,
		Logger: zerolog.New(&log)}
	_, err := r.Run(context.Background(), runReq(t, "rebase"))
	for _, where := range []string{fmt.Sprint(err), log.String()} {
		for _, secret := range []string{"hunter2hunter2", "letmein99", token} {
			if strings.Contains(where, secret) {
				t.Errorf("%q shows %q", where, secret)
			}
		}
		if !strings.Contains(where, "push failed") {
			t.Errorf("%q lost the failure", where)
		}
	}
}

func TestExecRunnerDownstreamResult(t *testing.T) {
	t.Parallel()
	r := runners.ExecRunner{Command: `echo '{"success":false,"error":"build failed","merge_request_url":null}'`}
	res, err := r.Run(context.Background(), runReq(t, "rebase"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Success || res.Error != "build failed" {
		t.Fatalf("result %+v", res)
	}
	r.Command = `echo '{"success":true,"merge_request_url":"https://mr/7"}'`
	if res, err = r.Run(context.Background(), runReq(t, "backport")); err != nil || !res.Success || res.MergeRequestURL != "https://mr/7" {
		t.Fatalf("result %+v, %v", res, err)
	}
}

func TestExecRunnerErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, agent, cmd string
		bad              bool     // ErrBadOutput
		in               []string // substrings of the error
	}{
		{"non-zero exit", "rebase", `echo '{"success":true}'; echo "it broke" >&2; exit 3`, false, []string{"exit status 3", "it broke"}},
		{"killed", "rebase", `kill -9 $$`, false, []string{"killed by signal"}},
		{"not JSON", "triage", `echo "I am not JSON"; echo why >&2`, true, []string{"I am not JSON", "why"}},
		{"empty output", "rebase", `true`, true, []string{"empty output"}},
		{"unknown resolution", "triage", `echo '{"resolution":"maybe"}'`, true, []string{"maybe"}},
		{"no resolution", "triage", `echo '{"target_branch":"c9s"}'`, true, []string{"resolution"}},
		{"no success", "backport", `echo '{"merge_request_url":"x"}'`, true, []string{"success"}},
		{"success not a bool", "backport", `echo '{"success":"yes"}'`, true, []string{"success"}},
		{"data not an object", "triage", `echo '{"resolution":"rebase","data":[1]}'`, true, []string{"data"}},
		{"stdout too large", "rebase", `head -c 300000 /dev/zero | tr '\0' a; echo`, true, []string{"exceeds"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runners.ExecRunner{Command: c.cmd, MaxStdout: 100_000}
			_, err := r.Run(context.Background(), runReq(t, c.agent))
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, runners.ErrBadOutput) != c.bad {
				t.Fatalf("ErrBadOutput: %v, want %v (%v)", errors.Is(err, runners.ErrBadOutput), c.bad, err)
			}
			for _, s := range c.in {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("error %q lacks %q", err, s)
				}
			}
		})
	}
}

func TestExecRunnerStderrIsBounded(t *testing.T) {
	t.Parallel()
	r := runners.ExecRunner{Command: `head -c 200000 /dev/zero | tr '\0' e >&2; echo END >&2; exit 1`, MaxStderr: 1000}
	_, err := r.Run(context.Background(), runReq(t, "rebase"))
	if err == nil || !strings.HasSuffix(err.Error(), "END") || len(err.Error()) > 4000 {
		t.Fatalf("error (%d bytes) %.200q", len(err.Error()), err)
	}
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	redistest.Eventually(t, 5*time.Second, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, "pid file %s", path)
	return pid
}

// On cancel the whole process group gets SIGTERM, then SIGKILL after the grace: a shell
// that traps TERM and a child that ignores it are both gone within the grace.
func TestExecRunnerCancelKillsProcessGroup(t *testing.T) {
	// Not parallel: it times the kill grace (SIGKILL not before 400 ms, the return within 2 s of it).
	dir := t.TempDir()
	const grace = 400 * time.Millisecond
	r := runners.ExecRunner{KillGrace: grace, Env: []string{"OUT=" + dir},
		Command: `sh -c 'trap "" TERM; echo $$ > "$OUT/child.tmp"; mv "$OUT/child.tmp" "$OUT/child"; while :; do sleep 0.05; done' &
trap 'echo "got TERM, ignoring it" >&2' TERM
echo $$ > "$OUT/leader.tmp"; mv "$OUT/leader.tmp" "$OUT/leader"
while :; do sleep 0.05; done`}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, runReq(t, "rebase"))
		done <- err
	}()
	leader, child := readPid(t, filepath.Join(dir, "leader")), readPid(t, filepath.Join(dir, "child"))
	if !alive(leader) || !alive(child) {
		t.Fatal("processes not running")
	}
	lost := errors.New("lease lost (test)")
	start := time.Now()
	cancel(lost)
	var err error
	select {
	case err = <-done:
	case <-time.After(grace + 5*time.Second):
		t.Fatal("Run did not return after the grace")
	}
	took := time.Since(start)
	if !errors.Is(err, lost) {
		t.Fatalf("err = %v, want the context's cause", err)
	}
	if took < grace {
		t.Fatalf("returned after %s, before the grace: SIGKILL too early", took)
	}
	if took > grace+2*time.Second {
		t.Fatalf("returned after %s", took)
	}
	redistest.Eventually(t, time.Second, func() bool { return !alive(leader) && !alive(child) },
		"leader %d and child %d gone", leader, child)
}

// A run that ends on its own but leaves a process behind in its group: the leftover is
// terminated, and it cannot hold the runner up by keeping stdout open.
func TestExecRunnerReapsLeftovers(t *testing.T) {
	// Not parallel: it bounds how long a run that leaves a process behind takes.
	dir := t.TempDir()
	r := runners.ExecRunner{KillGrace: time.Second, Env: []string{"OUT=" + dir},
		Command: `sleep 30 & echo $! > "$OUT/bg"; echo '{"success":true}'`}
	start := time.Now()
	res, err := r.Run(context.Background(), runReq(t, "rebase"))
	if err != nil || !res.Success {
		t.Fatalf("%+v, %v", res, err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("took %s", took)
	}
	bg := readPid(t, filepath.Join(dir, "bg"))
	redistest.Eventually(t, 2*time.Second, func() bool { return !alive(bg) }, "background process %d gone", bg)
}

// Issue 24: followups_acked is the agent's acknowledgement of its mailbox, not a triage
// field to carry downstream.
func TestParseResultFollowupsAcked(t *testing.T) {
	t.Parallel()
	res, err := runners.ParseResult("triage", []byte(`{"resolution":"postponed","followups_acked":["1-0","2-0"],"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(res.FollowupsAcked, ",") != "1-0,2-0" || res.Extra["followups_acked"] != nil || res.Extra["x"] == nil {
		t.Fatalf("result %+v", res)
	}
	if _, err := runners.ParseResult("rebase", []byte(`{"success":true,"followups_acked":"1-0"}`)); !errors.Is(err, runners.ErrBadOutput) {
		t.Fatalf("followups_acked not a list: %v", err)
	}
}
