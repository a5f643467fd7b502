package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/fakellm"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// kitAgent is one agent of examples/agents: the command that runs it.
type kitAgent struct{ name, command string }

// kitWorld clears ymirflow's settings from the environment, points REDIS_URL at the
// test Redis and sets the example agents' knobs (a working directory, how long they
// work, the resolution they answer). It returns the test's Redis client, its topology
// and the agents' working directory.
func kitWorld(t *testing.T, workMS string) (*redis.Client, event.Topology, string) {
	t.Helper()
	for name := range config.EnvNames() {
		t.Setenv(name, "")
	}
	t.Setenv("REDIS_URL", redistest.URL())
	admin, ns := redistest.Client(t)
	dir := t.TempDir()
	t.Setenv("AGENT_WORKDIR", dir)
	t.Setenv("AGENT_WORK_MS", workMS)
	t.Setenv("AGENT_RESOLUTION", "not-affected")
	return admin, event.Topology{Namespace: strings.TrimSuffix(ns, ":")}, dir
}

// kitAgents returns the example agents, the Go one built into a temp dir. Python 3 is
// required: without it the test fails and says so (as the Redis tests do without a
// server), rather than skipping what the kit promises.
func kitAgents(t *testing.T) []kitAgent {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not on PATH: the agent kit's test runs examples/agents/python/agent.py " +
			"(install Python 3, e.g. apt-get install -y python3)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "go-agent")
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "examples/agents/go")).CombinedOutput(); err != nil {
		t.Fatalf("go build examples/agents/go: %v\n%s", err, out)
	}
	return []kitAgent{
		{"python", py + " " + filepath.Join(root, "examples/agents/python/agent.py")},
		{"go", bin},
	}
}

// runAgent runs an example agent directly, as the exec runner does, with mailbox
// lines on fd 3 (YMIR_MAILBOX=/dev/fd/3) when mailbox is not nil.
func runAgent(t *testing.T, a kitAgent, env []string, stdin string, mailbox []string) (*exec.Cmd, *bytes.Buffer, *testlog.Buffer) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", a.command)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	var errb testlog.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // signalled as a group, as the exec runner does
	if mailbox != nil {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range mailbox {
			if _, err := w.WriteString(l + "\n"); err != nil {
				t.Fatal(err)
			}
		}
		w.Close()
		cmd.ExtraFiles = []*os.File{r}
		cmd.Env = append(cmd.Env, "YMIR_MAILBOX=/dev/fd/3")
		t.Cleanup(func() { r.Close() })
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out, &errb
}

// Issue 24 item 3: each example agent reads the Task JSON and its mailbox, acknowledges
// the follow-ups it heard, stamps its fence, refuses to commit over a higher fence, and
// stops on SIGTERM at once.
func TestExampleAgentsContract(t *testing.T) {
	t.Parallel() // its own temp dirs and processes; no setting, no timing beyond a bound
	for _, a := range kitAgents(t) {
		t.Run(a.name, func(t *testing.T) {
			dir := t.TempDir()
			env := func(fence string, more ...string) []string {
				return append([]string{"AGENT_WORKDIR=" + dir, "AGENT_WORK_MS=200", "YMIR_AGENT=triage",
					"YMIR_ISSUE_KEY=RHEL-7", "YMIR_FENCE=" + fence}, more...)
			}
			task := `{"metadata":{"issue":"RHEL-7"},"followups":[{"id":"1-0","event_type":"comment_created","author":"ann","body":"earlier"}]}`
			cmd, out, errb := runAgent(t, a, env("5"), task,
				[]string{`{"id":"9-0","event_type":"comment_created","author":"bob","body":"also update the tests"}`})
			if err := cmd.Wait(); err != nil {
				t.Fatalf("agent: %v\n%s", err, errb.String())
			}
			var res struct {
				Resolution string   `json:"resolution"`
				Acked      []string `json:"followups_acked"`
				Data       struct {
					Followups []string `json:"followups"`
				} `json:"data"`
			}
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatalf("result %q: %v", out.String(), err)
			}
			if res.Resolution != "postponed" || strings.Join(res.Acked, ",") != "9-0" || strings.Join(res.Data.Followups, ",") != "1-0,9-0" {
				t.Errorf("result %s: want the mailbox's 9-0 acked and both follow-ups heard", out.String())
			}
			comment, err := os.ReadFile(filepath.Join(dir, "triage/comments/RHEL-7.md"))
			if err != nil || !strings.Contains(string(comment), "<!-- ymir-fence: triage RHEL-7 5 -->") ||
				!strings.Contains(string(comment), "bob: also update the tests") {
				t.Errorf("comment %q (%v): want the fence marker and the follow-up", comment, err)
			}
			trailer, err := exec.Command("git", "-C", filepath.Join(dir, "triage/repo-RHEL-7"), "log", "-1",
				"--format=%(trailers:key=Ymir-Fence,valueonly)").Output()
			if err != nil || strings.TrimSpace(string(trailer)) != "triage/RHEL-7/5" {
				t.Errorf("commit trailer %q (%v), want triage/RHEL-7/5", trailer, err)
			}

			// A run with an older fence (a zombie) refuses to commit over fence 5.
			cmd, _, errb = runAgent(t, a, env("4"), `{}`, nil)
			if err := cmd.Wait(); err == nil || !strings.Contains(errb.String(), "refusing to commit: HEAD carries fence 5") {
				t.Errorf("a run with fence 4 after fence 5: %v\n%s", err, errb.String())
			}

			// SIGTERM: exit 143 within a second, nothing written.
			cmd, _, errb = runAgent(t, a, append(env("6"), "AGENT_WORK_MS=60000"), `{}`, nil)
			redistest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(errb.String(), "started") },
				"agent started: %s", errb.String())
			sent := time.Now()
			if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			// The group's shell dies of the signal; the agent says it stopped.
			if took := time.Since(sent); took > time.Second || !strings.Contains(errb.String(), "SIGTERM: stopping") {
				t.Errorf("after SIGTERM: %v after %s, want the agent stopped within 1s\n%s", err, took, errb.String())
			}
			if c, _ := os.ReadFile(filepath.Join(dir, "triage/comments/RHEL-7.md")); !bytes.Equal(c, comment) {
				t.Errorf("the stopped run wrote its comment:\n%s", c)
			}
		})
	}
}

// Issue 24 item 3: `ymirflow worker --runner exec --exec <agent>` runs each example
// agent against the fake Jira: the triage outcome is recorded and labelled, with the
// lease's fence on the agent's commit and comment.
func TestExampleAgentsThroughWorker(t *testing.T) {
	agents := kitAgents(t)
	for _, a := range agents {
		t.Run(a.name, func(t *testing.T) { exampleAgentThroughWorker(t, a) })
	}
}

// exampleAgentThroughWorker runs a worker with agent a as its exec runner on one triage
// event and checks its record, its fenced outputs, the control channel and the log.
func exampleAgentThroughWorker(t *testing.T, a kitAgent) {
	// Not parallel: the worker reads its settings from the environment (t.Setenv).
	admin, topo, dir := kitWorld(t, "100")
	llm := startFakeLLM(t, fakellm.Options{CostUSD: 0.02})
	t.Setenv("AGENT_STEPS", "3")
	srv := fakejira.New(fakejira.Options{Token: "kit-token", Issues: []fakejira.Issue{{Key: "RHEL-901", Summary: "s"}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-901"},"user_triggered":true}`))
	task.UserTriggered = true
	msg, err := event.New(event.TriageRequested, "RHEL-901", task, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.NewPublisher(admin, 0).PublishID(context.Background(), topo.Stream("triage", "", true), msg); err != nil {
		t.Fatal(err)
	}
	rec, errb := runKitWorker(t, admin, topo, ts.URL, a.command)
	fence, _ := rec["fence"].(string)
	if rec["outcome"] != "not-affected" || fence == "" || fence == "0" {
		t.Fatalf("record %v: want outcome not-affected under a fence", rec)
	}
	if labels := srv.Labels("RHEL-901"); !strings.Contains(strings.Join(labels, ","), "ymir_triaged_not_affected") {
		t.Errorf("labels %v", labels)
	}
	comment, err := os.ReadFile(filepath.Join(dir, "triage/comments/RHEL-901.md"))
	if err != nil || !strings.Contains(string(comment), "<!-- ymir-fence: triage RHEL-901 "+fence+" -->") {
		t.Errorf("comment %q (%v): want the lease's fence %s", comment, err, fence)
	}
	trailer, err := exec.Command("git", "-C", filepath.Join(dir, "triage/repo-RHEL-901"), "log", "-1",
		"--format=%(trailers:key=Ymir-Fence,valueonly)").Output()
	if err != nil || strings.TrimSpace(string(trailer)) != "triage/RHEL-901/"+fence {
		t.Errorf("commit trailer %q (%v), want triage/RHEL-901/%s", trailer, err, fence)
	}
	checkKitControlChannel(t, admin, topo, llm, fence)
	sc := bufio.NewScanner(strings.NewReader(errb.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"level":"error"`) {
			t.Errorf("worker logged an error: %s", sc.Text())
		}
	}
}

// runKitWorker runs `ymirflow worker --runner exec --exec command` against the fake Jira
// at jiraURL until the triage of RHEL-901 is recorded done, then stops it (exit 0). It
// returns the record and the worker's stderr.
func runKitWorker(t *testing.T, admin *redis.Client, topo event.Topology, jiraURL, command string) (map[string]any, *testlog.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testlog.Buffer
	errb := &testlog.Buffer{}
	done := make(chan int, 1)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s%s", out.String(), errb.String())
		}
	})
	go func() {
		done <- run(ctx, []string{"worker", "--agent", "triage", "--runner", "exec", "--exec", command,
			"--runner-env", "AGENT_*", "--ymir-namespace", topo.Namespace, "--metrics-addr", "",
			"--jira-url", jiraURL, "--jira-token", "kit-token", "--jira-rate-limit", "-1", "--block-time", "200ms", "--consumer-name", "w1"}, &out, errb)
	}()
	var rec map[string]any
	redistest.Eventually(t, 30*time.Second, func() bool {
		select {
		case code := <-done:
			t.Fatalf("worker exit %d: %s%s", code, out.String(), errb.String())
		default:
		}
		res, _ := admin.XRange(ctx, topo.Results(), "-", "+").Result()
		for _, m := range res {
			if m.Values["event_type"] == event.StageDone && m.Values["issue_key"] == "RHEL-901" {
				rec = m.Values
				return true
			}
		}
		return false
	}, "triage of RHEL-901 recorded")
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("worker exit %d: %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	return rec, errb
}

// checkKitControlChannel: three metered calls, counted once each, and the last
// checkpoint saved under the run's fence.
func checkKitControlChannel(t *testing.T, admin *redis.Client, topo event.Topology, llm *fakellm.Server, fence string) {
	t.Helper()
	ledger, err := agentctl.NewLedger(admin, topo.Namespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	costs, err := ledger.Costs(context.Background(), "RHEL-901")
	if err != nil || llm.Calls() != 3 || costs.Micro != agentctl.Micro(3*0.02) || costs.Reports != 3 || costs.TokensIn != 3000 {
		t.Errorf("ledger %+v (%v) after %d calls, want 3 reports of 0.02 USD", costs, err, llm.Calls())
	}
	ck, ok, err := ledger.LastCheckpoint(context.Background(), "triage", "RHEL-901")
	if err != nil || !ok || !strings.Contains(string(ck.Data), `"completed": ["step-1", "step-2", "step-3"]`) &&
		!strings.Contains(string(ck.Data), `"completed":["step-1","step-2","step-3"]`) || strconv.FormatInt(ck.Fence, 10) != fence {
		t.Errorf("checkpoint %s fence %d (%v %v), want three steps under fence %s", ck.Data, ck.Fence, ok, err, fence)
	}
}

// startFakeLLM starts the fake LLM endpoint and points the example agents at it
// (AGENT_LLM_URL).
func startFakeLLM(t *testing.T, o fakellm.Options) *fakellm.Server {
	t.Helper()
	llm := fakellm.New(o)
	url, err := llm.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(llm.Close)
	t.Setenv("AGENT_LLM_URL", url)
	return llm
}
