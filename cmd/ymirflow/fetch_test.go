package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// fetchEnv runs `ymirflow fetch` through run() against a fake Jira and the test Redis.
type fetchEnv struct {
	t    *testing.T
	srv  *fakejira.Server
	url  string
	ns   string
	topo event.Topology
	base []string
}

func newFetchEnv(t *testing.T, fo fakejira.Options, handler func(http.Handler) http.Handler) *fetchEnv {
	t.Helper()
	for name := range config.EnvNames() {
		t.Setenv(name, "") // empty is unset: nothing leaks in from the environment
	}
	_, ns := redistest.Client(t)
	fe := &fetchEnv{t: t, srv: fakejira.New(fo), ns: ns, topo: event.Topology{Namespace: strings.TrimSuffix(ns, ":")}}
	var h http.Handler = fe.srv
	if handler != nil {
		h = handler(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	fe.url = ts.URL
	fe.base = []string{"--jira-url", ts.URL, "--jira-token", "tok", "--jira-rate-limit", "-1",
		"--redis-url", redistest.URL(), "--ymir-namespace", fe.topo.Namespace, "--log-level", "debug"}
	return fe
}

func (fe *fetchEnv) run(ctx context.Context, args ...string) (string, string, int) {
	var out, errb testlog.Buffer
	code := run(ctx, append([]string{"fetch"}, append(fe.base, args...)...), &out, &errb)
	return out.String(), errb.String(), code
}

func TestFetchOnce(t *testing.T) {
	now := time.Now()
	fe := newFetchEnv(t, fakejira.Options{Issues: []fakejira.Issue{
		{Key: "RHEL-1", Updated: now}, {Key: "RHEL-2", Updated: now, Labels: []string{"ymir_retry_needed"}},
		{Key: "RHEL-3", Updated: now, Labels: []string{"ymir_triaged"}},
	}}, nil)
	out, errs, code := fe.run(context.Background(), "--once")
	if code != 0 {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
	if !strings.Contains(out, "fetch: found 3, published 2, skipped 1 (locked 0, queued 0, labelled 1, modular 0, max-issues 0)") {
		t.Errorf("stdout %q", out)
	}
	// The zerolog summary line.
	var summary map[string]any
	for _, line := range strings.Split(errs, "\n") {
		if strings.Contains(line, `"sweep done"`) {
			_ = json.Unmarshal([]byte(line), &summary)
		}
	}
	if summary["found"] != 3.0 || summary["published"] != 2.0 || summary["skipped_labelled"] != 1.0 || summary["skipped_locked"] != 0.0 {
		t.Errorf("summary log line %v\nstderr %s", summary, errs)
	}
	rdb, _ := redistest.Client(t)
	if n := rdb.XLen(context.Background(), fe.topo.Stream("triage", "", false)).Val(); n != 2 {
		t.Errorf("%d triage requests", n)
	}
	// Again: nothing is published twice; RHEL-2 now carries ymir_triage_in_progress.
	out, _, code = fe.run(context.Background(), "--once", "--dry-run")
	if code != 0 || !strings.Contains(out, "published 0, skipped 3 (locked 0, queued 1, labelled 2") || !strings.Contains(out, "dry run") {
		t.Errorf("second run: exit %d, %q", code, out)
	}
}

// A 401 ends `fetch` with exit 1 and one clear line, without the token.
func TestFetchUnauthorized(t *testing.T) {
	fe := newFetchEnv(t, fakejira.Options{Token: "right-token", Issues: []fakejira.Issue{{Key: "RHEL-1"}}}, nil)
	fe.base[3] = "wrong-s3cret-token"
	out, errs, code := fe.run(context.Background(), "--once")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstderr %s", code, errs)
	}
	last := lastLine(errs)
	if !strings.HasPrefix(last, "ymirflow fetch: Jira at "+fe.url+" refused the credentials (401): check JIRA_EMAIL and JIRA_TOKEN") {
		t.Errorf("last stderr line %q", last)
	}
	if strings.Contains(errs+out, "wrong-s3cret-token") {
		t.Error("the token leaked into the output")
	}
	// --interval stops too: no point sweeping with bad credentials.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, code := fe.run(ctx, "--interval", "10ms"); code != 1 || ctx.Err() != nil {
		t.Errorf("--interval with bad credentials: exit %d, ctx %v", code, ctx.Err())
	}
}

// Redis down: exit 1 naming the URL without its password.
func TestFetchRedisDown(t *testing.T) {
	fe := newFetchEnv(t, fakejira.Options{}, nil)
	port := redistest.FreePort(t)
	url := "redis://admin:hunter2@127.0.0.1:" + strconv.Itoa(port) + "/0"
	fe.base[7] = url
	_, errs, code := fe.run(context.Background(), "--once")
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstderr %s", code, errs)
	}
	if strings.Contains(errs, "hunter2") || !strings.Contains(lastLine(errs), "127.0.0.1:"+strconv.Itoa(port)) {
		t.Errorf("stderr %q", errs)
	}
}

// --interval sweeps until the context ends (SIGTERM), and a sweep in progress when the
// signal arrives is finished, not cut short.
func TestFetchIntervalStopsTheSweepInProgress(t *testing.T) {
	var mu sync.Mutex
	searches := 0
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	fe := newFetchEnv(t, fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1", Updated: time.Now()}}},
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.Contains(r.URL.Path, "/search") {
					mu.Lock()
					searches++
					n := searches
					mu.Unlock()
					if n == 3 { // the third sweep is under way when the signal comes
						held <- struct{}{}
						<-hold
					}
				}
				next.ServeHTTP(w, r)
			})
		})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var out, errs string
	var code int
	go func() {
		out, errs, code = fe.run(ctx, "--interval", "20ms")
		close(done)
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("third sweep never started")
	}
	cancel()
	// The signal came in the middle of the sweep's search: nothing of it was consumed
	// yet, so it stops there and the next run sees the new issue.
	fe.srv.AddIssues(fakejira.Issue{Key: "RHEL-2", Updated: time.Now()})
	close(hold)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("fetch did not stop after the signal")
	}
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	sweeps := regexp.MustCompile(`(?m)^fetch: found`).FindAllString(out, -1)
	if len(sweeps) != 3 {
		t.Errorf("%d sweeps reported, want 3:\n%s", len(sweeps), out)
	}
	if !strings.Contains(errs, "stopped by a signal during a sweep") {
		t.Errorf("the interrupted sweep is not reported as stopped: %s", errs)
	}
	rdb, _ := redistest.Client(t)
	if n := rdb.XLen(context.Background(), fe.topo.Stream("triage", "", false)).Val(); n != 1 {
		t.Errorf("%d triage requests, want RHEL-1's alone (RHEL-2 waits for the next run)", n)
	}
}

func TestFakeJiraCommand(t *testing.T) {
	for name := range config.EnvNames() {
		t.Setenv(name, "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb testlog.Buffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"fakejira", "--addr", "127.0.0.1:0", "--issues", "13", "--seed", "4"}, &out, &errb)
	}()
	var url string
	redistest.Eventually(t, 5*time.Second, func() bool {
		m := regexp.MustCompile(`at (http://127\.0\.0\.1:\d+)`).FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, "fakejira prints its URL (stdout %q, stderr %q)", out.String(), errb.String())
	if !strings.Contains(out.String(), "serving 13 sample issues (seed 4)") {
		t.Errorf("stdout %q", out.String())
	}
	resp, err := http.Post(url+"/rest/api/2/search", "application/json", strings.NewReader(`{"jql":"any","maxResults":100}`))
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Total  int
		Issues []struct{ Key string }
	}
	_ = json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if page.Total != 13 || len(page.Issues) != 13 || page.Issues[0].Key != "RHEL-1001" {
		t.Errorf("search: %+v", page)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d: %s", code, errb.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fakejira did not stop")
	}

	// --issues-file, and a file that is not issues.
	dir := t.TempDir()
	good, bad := dir+"/issues.json", dir+"/bad.json"
	writeFile(t, good, `[{"key":"ABC-1","fields":{"labels":["ymir_todo"],"updated":"2024-05-01T10:20:30.000+0000","status":{"name":"New"}}}]`)
	writeFile(t, bad, `{"nope":1}`)
	if code := run(context.Background(), []string{"fakejira", "--addr", "127.0.0.1:0", "--issues-file", bad}, &out, &errb); code != 1 {
		t.Errorf("bad file: exit %d", code)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	var out2 testlog.Buffer
	go func() {
		done <- run(ctx2, []string{"fakejira", "--addr", "127.0.0.1:0", "--issues-file", good}, &out2, &errb)
	}()
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(out2.String(), "serving 1 issues from") },
		"fakejira serves the file (stdout %q)", out2.String())
	cancel2()
	if code := <-done; code != 0 {
		t.Errorf("exit %d", code)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
