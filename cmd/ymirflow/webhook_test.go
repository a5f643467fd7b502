package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// waitOut polls out until re matches it, and returns the first group.
func waitOut(t *testing.T, out, errs *testlog.Buffer, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %s in stdout %q\nstderr %s", re, out, errs)
	return ""
}

// Done-when of issue 17: `ymirflow fakejira --webhook URL --webhook-secret-file F` sending
// to `ymirflow webhook`; a maintainer adding ymir_todo puts exactly one triage request on
// ymir:triage:todo and flips the label.
func TestWebhookCommandEndToEnd(t *testing.T) {
	for name := range config.EnvNames() {
		t.Setenv(name, "")
	}
	rdb, ns := redistest.Client(t)
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	issues := filepath.Join(dir, "issues.json")
	if err := os.WriteFile(secretFile, []byte("hook-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(issues, []byte(`[{"key":"RHEL-77","fields":{"labels":["ymir_triaged_rebase"],
		"updated":"2026-01-01T00:00:00.000+0000","components":[{"name":"openssl"}]}}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	codes := make(chan int, 2)
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if c := <-codes; c != 0 {
				t.Errorf("a command exited %d", c)
			}
		}
	})

	// The receiver asks the fake for its own account at start, and the fake needs the
	// receiver's URL: the fake starts first, sending to a port reserved for the receiver.
	hookURL := "http://127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) + "/"
	var jout, jerr, wout, werr testlog.Buffer
	go func() {
		codes <- run(ctx, []string{"fakejira", "--addr", "127.0.0.1:0", "--issues-file", issues,
			"--webhook", hookURL, "--webhook-secret-file", secretFile}, &jout, &jerr)
	}()
	jiraURL := waitOut(t, &jout, &jerr, regexp.MustCompile(`serving .* at (http://\S+)`))
	go func() {
		codes <- run(ctx, []string{"webhook", "--addr", strings.TrimSuffix(strings.TrimPrefix(hookURL, "http://"), "/"),
			"--metrics-addr", "", "--jira-url", jiraURL, "--jira-token", "tok", "--jira-rate-limit", "-1",
			"--jira-jql", "project = RHEL", "--jira-trigger-group", fakejira.SampleTriggerGroup,
			"--webhook-secret-file", secretFile, "--redis-url", redistest.URL(), "--ymir-namespace", topo.Namespace,
			"--log-level", "debug"}, &wout, &werr)
	}()
	waitOut(t, &wout, &werr, regexp.MustCompile(`receiving Jira webhooks at (\S+) \(signed`))

	// The maintainer adds ymir_todo, as in Jira's UI.
	req, _ := http.NewRequest(http.MethodPut, jiraURL+"/rest/api/2/issue/RHEL-77",
		bytes.NewReader([]byte(`{"update":{"labels":[{"add":"ymir_todo"}]}}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set(fakejira.HeaderActAs, fakejira.SampleMaintainer.AccountID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("label add: %d", resp.StatusCode)
	}

	todo := topo.Stream("triage", "", true)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := getLabels(t, jiraURL, "RHEL-77")
		if slices.Contains(got, labels.TriageInProgress) && !slices.Contains(got, labels.Todo) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("labels %v\nwebhook stderr:\n%s", got, werr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The flip's own webhook is answered (and ignored) before anything else could happen.
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(werr.String(), `"outcome":"own_account"`) {
		if time.Now().After(deadline) {
			t.Fatalf("the flip's webhook was not ignored as ymirflow's own\n%s", werr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	xs, err := rdb.XRange(context.Background(), todo, "-", "+").Result()
	if err != nil || len(xs) != 1 {
		t.Fatalf("%s: %d entries (%v)", todo, len(xs), err)
	}
	if n := rdb.XLen(context.Background(), topo.Stream("triage", "", false)).Val(); n != 0 {
		t.Errorf("%d entries on the backlog stream", n)
	}
	if msg := event.DecodeEntry(todo, xs[0].ID, xs[0].Values); msg.Metadata.Get(event.MetaIssueKey) != "RHEL-77" {
		t.Errorf("entry %v", msg.Metadata)
	}
}

// getLabels reads an issue's labels from the fake over HTTP.
func getLabels(t *testing.T, base, key string) []string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/rest/api/2/issue/"+key+"?fields=labels", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var is struct {
		Fields struct {
			Labels []string `json:"labels"`
		} `json:"fields"`
	}
	if err := jsonDecode(resp, &is); err != nil {
		t.Fatal(err)
	}
	return is.Fields.Labels
}

func jsonDecode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }
