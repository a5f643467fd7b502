package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// With JIRA_RATE, fetch's Jira requests go through the budget shared in Redis: Jira's
// 429 with Retry-After pauses it for every process (the pause key lives on after the
// sweep), and the sweep still completes.
func TestFetchSharesJiraRate(t *testing.T) {
	fe := newFetchEnv(t, fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1", Updated: time.Now()}}}, nil)
	fe.srv.FailNext(1, http.StatusTooManyRequests, "30")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The sweep would wait out the 30 s pause: the test looks at the key meanwhile and
	// then ends it.
	done := make(chan struct{})
	var out, errs string
	var code int
	go func() {
		defer close(done)
		out, errs, code = fe.run(ctx, "--once", "--jira-rate", "5/s", "--jira-max-retries", "1")
	}()
	rdb, _ := redistest.Client(t)
	pause := fe.ns + "ratelimit:jira:pause"
	redistest.Eventually(t, 10*time.Second, func() bool { return rdb.PTTL(ctx, pause).Val() > 20*time.Second },
		"the 429 to pause the shared budget (%s)", pause)
	if n := rdb.Exists(ctx, "rate:"+fe.ns+"ratelimit:jira").Val(); n != 1 {
		t.Errorf("no GCRA state at rate:%sratelimit:jira: the request did not go through the shared budget", fe.ns)
	}
	cancel()
	<-done
	if strings.Contains(errs, "panic") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
}

// With RUN_RATE, a worker starts at most the budget's runs and re-queues the rest in its
// stream's delayed set (acked, not dropped), and its /metrics counts the refusals.
func TestWorkerRunRate(t *testing.T) {
	_, ns := redistest.Client(t)
	rdb, _ := redistest.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base := []string{"--redis-url", redistest.URL(), "--ymir-namespace", ns + "ymir"}
	errs := &testlog.Buffer{}
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, append([]string{"worker", "--agent", "triage", "--runner", "demo", "--metrics-addr", "127.0.0.1:0",
			"--run-rate", "1/h", "--run-rate-burst", "1"}, base...), io.Discard, errs)
	}()
	redistest.Eventually(t, 30*time.Second, func() bool { return ready(errs.String()) }, "the worker to start: %s", errs.String())
	var out testlog.Buffer
	if c := run(ctx, append(append([]string{"enqueue"}, base...), "RHEL-1", "RHEL-2", "RHEL-3"), &out, &out); c != 0 {
		t.Fatalf("enqueue: exit %d: %s", c, out.String())
	}
	delayed := "{" + ns + "ymir:triage}:delayed"
	redistest.Eventually(t, 20*time.Second, func() bool { return rdb.ZCard(ctx, delayed).Val() == 2 },
		"2 of 3 events re-queued in %s: %s", delayed, errs.String())
	m := metricsAddrRe.FindStringSubmatch(errs.String())
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), `ymirflow_ratelimit_throttled_total{limit="run:triage",reason="rate"} 2`) {
		t.Errorf("/metrics lacks the 2 refusals:\n%s", grepLines(string(body), "ratelimit"))
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("worker exit %d: %s", c, errs.String())
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
