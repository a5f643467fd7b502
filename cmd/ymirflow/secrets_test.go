package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

func randHex(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// aclUser creates a Redis ACL user with a password on the shared test server, deleted
// when the test ends, and returns REDIS_URL for it.
func aclUser(t *testing.T, admin *redis.Client, password string) string {
	t.Helper()
	name := "ymir-test-" + randHex(t)
	if err := admin.Do(context.Background(), "ACL", "SETUSER", name, "reset", "on", ">"+password, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", name) })
	u, err := url.Parse(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(name, password)
	return u.String()
}

// Issue 14, done when: a worker started with a password in REDIS_URL and a JIRA_TOKEN,
// running an agent that dumps its environment and echoes both secrets (and a token it
// was handed through RUNNER_ENV) on stderr before failing, leaves none of them in the
// agent's environment, Jira, ymir:results, ymir:dead, its log or `dlq show`.
func TestWorkerKeepsSecrets(t *testing.T) {
	for name := range config.EnvNames() {
		t.Setenv(name, "")
	}
	admin, ns := redistest.Client(t)
	redisPW := "redis-pw-" + randHex(t)
	jiraToken := "jira-token-" + randHex(t)
	gitlabToken := "gitlab-token-" + randHex(t)
	redisURL := aclUser(t, admin, redisPW)
	t.Setenv("REDIS_URL", redisURL)
	t.Setenv("JIRA_TOKEN", jiraToken)
	t.Setenv("GITLAB_TOKEN", gitlabToken)
	t.Setenv("RUNNER_ENV", "GITLAB_TOKEN")

	srv := fakejira.New(fakejira.Options{Token: jiraToken, Issues: []fakejira.Issue{{Key: "RHEL-900", Summary: "s"}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	// The agent: dumps its environment, prints every secret it knows on stderr (the
	// worker's two are written into the script, as a prompt-injected agent that found
	// them elsewhere would), and fails.
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent.sh")
	script := "env > " + dir + "/env.$YMIR_ATTEMPT\n" +
		"echo \"leaking redis=" + redisPW + " url=" + redisURL + " jira=" + jiraToken + " gitlab=$GITLAB_TOKEN\" >&2\n" +
		"echo \"json: {\\\"token\\\": \\\"" + jiraToken + "\\\"}\" >&2\nexit 1\n"
	if err := os.WriteFile(agent, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}

	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-900"},"user_triggered":true}`))
	task.UserTriggered = true
	msg, err := event.New(event.TriageRequested, "RHEL-900", task, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := event.NewPublisher(admin, 0).PublishID(context.Background(), topo.Stream("triage", "", true), msg); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb testlog.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"worker", "--agent", "triage", "--runner", "exec", "--exec", "sh " + agent,
			"--ymir-namespace", topo.Namespace, "--max-retries", "2", "--metrics-addr", "", "--log-level", "debug",
			"--jira-url", ts.URL, "--jira-rate-limit", "-1", "--block-time", "200ms", "--consumer-name", "w1"}, &out, &errb)
	}()
	var deadID string
	redistest.Eventually(t, 30*time.Second, func() bool {
		dead, _ := admin.XRange(ctx, topo.Dead(), "-", "+").Result()
		if len(dead) == 1 {
			deadID = dead[0].ID
		}
		return deadID != "" && len(srv.Comments("RHEL-900")) > 0
	}, "the event is dead-lettered and the failure commented on (log %s)", errb.String())
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("worker exit %d: %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}

	secrets := map[string]string{"redis password": redisPW, "jira token": jiraToken, "gitlab token": gitlabToken}
	check := func(where, text string) {
		t.Helper()
		for what, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s holds the %s:\n%s", where, what, text)
			}
		}
	}
	checkAgentEnv(t, dir, redisPW, jiraToken, gitlabToken)
	// Jira: the comment names the outcome, the attempts and the dead letter, never stderr.
	comments := srv.Comments("RHEL-900")
	for _, c := range comments {
		check("a Jira comment", c.Body)
		if strings.Contains(c.Body, "leaking") {
			t.Errorf("a Jira comment quotes the agent's stderr: %s", c.Body)
		}
	}
	last := comments[len(comments)-1].Body
	if !strings.Contains(last, "failed after 2 attempts") || !strings.Contains(last, "ymir_triage_errored") ||
		!strings.Contains(last, "ymirflow dlq show "+deadID) {
		t.Errorf("failure comment %q", last)
	}
	checkStreamsClean(t, admin, topo, check)
	dead, _ := admin.XRange(context.Background(), topo.Dead(), deadID, deadID).Result()
	if e := dead[0].Values[event.DeadFieldError].(string); !strings.Contains(e, "leaking redis=[redacted]") ||
		!strings.Contains(e, "gitlab=[redacted]") {
		t.Errorf("dead_error does not hold the redacted stderr tail: %s", e)
	}
	log := out.String() + errb.String()
	check("the worker's log", log)
	if !strings.Contains(log, "[redacted]") {
		t.Errorf("the log shows no redacted stderr:\n%s", log)
	}
	// The operator reads the redacted stderr tail.
	var sout, serr testlog.Buffer
	if code := run(context.Background(), []string{"dlq", "show", deadID, "--ymir-namespace", topo.Namespace}, &sout, &serr); code != 0 {
		t.Fatalf("dlq show: exit %d: %s", code, serr.String())
	}
	check("dlq show", sout.String()+serr.String())
	if !strings.Contains(sout.String(), "leaking redis=[redacted]") {
		t.Errorf("dlq show does not show the stderr tail:\n%s", sout.String())
	}
	// The CLI redacts what it prints even when the data holds a secret verbatim (written
	// by something that did not redact).
	raw, err := admin.XAdd(context.Background(), &redis.XAddArgs{Stream: topo.Dead(), Values: map[string]any{
		"_watermill_message_uuid": "u", "payload": "{}", event.DeadFieldError: "token " + jiraToken + " pw " + redisPW,
		event.DeadFieldStream: topo.Stream("triage", "", false), event.DeadFieldID: "1-1"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var cout, cerr testlog.Buffer
	for _, args := range [][]string{{"dlq", "show", raw}, {"dlq", "show", raw, "--json"}, {"dlq", "list"}} {
		if code := run(context.Background(), append(args, "--ymir-namespace", topo.Namespace), &cout, &cerr); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, cerr.String())
		}
	}
	check("the CLI's output", cout.String()+cerr.String())
	if !strings.Contains(cout.String(), "token [redacted] pw [redacted]") {
		t.Errorf("CLI output:\n%s", cout.String())
	}
}

// checkAgentEnv checks the environments TestWorkerKeepsSecrets' agent dumped in dir
// (one per attempt): neither of the worker's secrets, nor REDIS_URL at all; the token
// RUNNER_ENV names is there.
func checkAgentEnv(t *testing.T, dir, redisPW, jiraToken, gitlabToken string) {
	t.Helper()
	for _, attempt := range []string{"1", "2"} {
		env, err := os.ReadFile(filepath.Join(dir, "env."+attempt))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{redisPW, jiraToken, "REDIS_URL=", "JIRA_TOKEN="} {
			if strings.Contains(string(env), s) {
				t.Errorf("agent environment of attempt %s holds %q:\n%s", attempt, s, env)
			}
		}
		if !strings.Contains(string(env), "GITLAB_TOKEN="+gitlabToken) {
			t.Errorf("GITLAB_TOKEN (RUNNER_ENV) not passed:\n%s", env)
		}
	}
}

// checkStreamsClean checks that no field of the results and dead-letter streams holds a
// secret (check says which).
func checkStreamsClean(t *testing.T, admin redis.UniversalClient, topo event.Topology, check func(where, text string)) {
	t.Helper()
	for _, stream := range []string{topo.Results(), topo.Dead()} {
		entries, err := admin.XRange(context.Background(), stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			for k, v := range e.Values {
				check(stream+" field "+k, v.(string))
			}
		}
	}
}
