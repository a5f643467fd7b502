package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/progress"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// Issue 35 items 4 and 5: dev shows what happens after its banner, one plain line per
// outcome when stdout is not a terminal (no cursor control), and a maintainer's
// comment made through the fake Jira during a triage run reaches the running agent
// (ON_CONFLICT's dev default for triage, comment.created=deliver,*=drop): delivered to
// its mailbox, acknowledged by the simulated agent. At Ctrl-C the summary (totals per
// stage and outcome, how long it ran) comes before the "stopped" line.
func TestDevShowsOutcomesAndDeliversAComment(t *testing.T) {
	// Not parallel: a real process on free ports, as TestDevRunsAPipelineUntilCtrlC.
	bin := buildBinary(t)
	port := func() string { return "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) }
	redisAddr, jiraAddr := port(), port()
	// Runs of 3 to 9 s: a comment made once the run holds its lease meets it live. One
	// issue: nothing else on the comment's stream holds it back (a subscription busy
	// with another issue's long run may have read the comment ahead, and hold it until
	// that run ends).
	dev := startProc(t, bin, []string{"LOG_LEVEL=info"}, "dev", "--embedded-redis-addr", redisAddr, "--web-addr", port(),
		"--fakejira-addr", jiraAddr, "--webhook-addr", port(), "--demo-duration", "6s", "--issues", "1", "--log-dir", t.TempDir())
	dev.waitLine(false, 30*time.Second, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "console ") })

	other := []string{"REDIS_URL=redis://" + redisAddr + "/0", "YMIR_NAMESPACE=ymir"}
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := startProc(t, bin, other, "locks", "--json")
		if code := p.exit(20 * time.Second); code != 0 {
			t.Fatalf("locks: exit %d\n%s", code, p.stderr())
		}
		if out := p.stdout(); strings.Contains(out, `"issue": "RHEL-1001"`) && strings.Contains(out, `"owner": "dev-triage`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("RHEL-1001's triage never held its lease\nstdout:\n%s", dev.stdout())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The README's comment, through the fake Jira (which tells the webhook receiver).
	req, _ := http.NewRequest(http.MethodPost, "http://"+jiraAddr+"/rest/api/2/issue/RHEL-1001/comment",
		strings.NewReader(`{"body":"also update the tests"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(fakejira.HeaderActAs, fakejira.SampleMaintainer.AccountID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("comment: %d", resp.StatusCode)
	}
	dev.waitLine(false, 20*time.Second, func(l string) bool {
		return strings.HasPrefix(l, "RHEL-1001 triage: the running agent acknowledged comment ") &&
			strings.Contains(l, "by "+fakejira.SampleMaintainer.AccountID)
	})
	dev.waitLine(false, 20*time.Second, func(l string) bool { return strings.HasPrefix(l, "RHEL-1001 triaged") })
	if !strings.Contains(dev.stdout(), "RHEL-1001 triage: a follow-up reached the running agent's mailbox") {
		t.Errorf("no lock.delivered line:\n%s", dev.stdout())
	}

	if code, _ := dev.stop(30 * time.Second); code != 0 {
		t.Fatalf("dev: exit %d after SIGINT\n%s", code, dev.stderr())
	}
	out := dev.stdout()
	if strings.Contains(out, "\x1b[") {
		t.Errorf("cursor control on a stdout that is not a terminal:\n%q", out)
	}
	summary, stopped := strings.Index(out, "\nymirflow dev: ran "), strings.Index(out, "\nymirflow dev: stopped; ")
	if summary < 0 || stopped < summary {
		t.Fatalf("no summary before the stopped line:\n%s", out)
	}
	var triageRow string
	for _, l := range strings.Split(out[summary:stopped], "\n") {
		if strings.HasPrefix(l, "  triage ") {
			triageRow = l
		}
	}
	if !strings.Contains(triageRow, "comment acknowledged 1") || !strings.Contains(triageRow, "delivered 1") {
		t.Errorf("the summary's triage row %q does not count the comment\n%s", triageRow, out[summary:stopped])
	}
}

// Issue 35 item 5: a burst of outcomes prints at most devLinesPerSecond lines a second
// and counts the rest in one line, rather than a scroll nobody reads; the summary
// counts them all. The clock is the test's: no timing in the assertion.
func TestDevDisplayBoundsItsLines(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	var out bytes.Buffer
	dw, err := newDevWatch(ctx, rdb, topo, &out, false)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	dw.lines.Now = func() time.Time { return now }
	res := event.NewResults(rdb, topo.Results(), 0)
	const burst = 30
	for i := range burst {
		if _, err := res.Add(ctx, event.Record{EventType: event.StageDone, Agent: "rebase", IssueKey: fmt.Sprintf("RHEL-%d", 2000+i),
			MessageID: fmt.Sprintf("%d-0", i+1), Stream: topo.Stream("rebase", "c9s", false), Fence: "1", Outcome: "ymir_rebased"}); err != nil {
			t.Fatal(err)
		}
	}
	outcomeLines := func() []string {
		var ls []string
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "RHEL-") {
				ls = append(ls, l)
			}
		}
		return ls
	}
	dw.step(ctx, false)
	if got := outcomeLines(); len(got) != devLinesPerSecond || got[0] != "RHEL-2000 rebase c9s done (fence 1)" {
		t.Fatalf("a burst of %d printed %d outcome lines, want %d:\n%s", burst, len(got), devLinesPerSecond, out.String())
	}
	if strings.Contains(out.String(), " more ") {
		t.Fatalf("the skipped lines were counted before a second passed:\n%s", out.String())
	}
	now = now.Add(time.Second)
	dw.step(ctx, false)
	more := fmt.Sprintf("… %d more ", burst-devLinesPerSecond)
	if !strings.Contains(out.String(), more) || len(outcomeLines()) != devLinesPerSecond {
		t.Fatalf("a second later: want one line %q and no other outcome line:\n%s", more, out.String())
	}
	var sum bytes.Buffer
	dw.summary(ctx, &sum)
	if !strings.Contains(sum.String(), fmt.Sprintf("%d runs done (0 failed)", burst)) ||
		!strings.Contains(sum.String(), fmt.Sprintf("ymir_rebased %d", burst)) {
		t.Fatalf("summary:\n%s", sum.String())
	}
}

// Issue 35 item 4: dev's busy-policy settings are the worker's, checked the same way: a
// bad ON_CONFLICT is refused at start, naming the setting, before anything starts.
func TestDevRefusesABadBusyPolicy(t *testing.T) {
	for name := range config.EnvNames() {
		t.Setenv(name, "") // not parallel: the settings come from the environment too
	}
	for _, tc := range []struct{ args []string }{
		{[]string{"--on-conflict", "bogus"}},
		{[]string{"--mailbox-depth", "0"}},
		{[]string{"--concurrency", "0"}},
		{[]string{"--lock-scope", "issue"}}, // triage's default delivers comments: a shared key cannot
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"dev", "--embedded-redis-addr", "127.0.0.1:0"}, tc.args...), &out, &errb)
		setting := strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(tc.args[0], "--"), "-", "_")) + " (" + tc.args[0] + ")"
		if code != exitUsage || !strings.Contains(errb.String(), setting) || out.Len() > 0 {
			t.Errorf("dev %v: exit %d, stdout %q, stderr %q; want %d naming %s", tc.args, code, out.String(), errb.String(), exitUsage, setting)
		}
	}
}

// The lines dev prints for each kind of record: what happened to which issue at which
// stage, a comment's fate included (acknowledged live, rolled into a run, reached none).
func TestDevOutcomeLines(t *testing.T) {
	t.Parallel()
	topo := event.Topology{Namespace: "ymir"}
	tally := progress.NewTally(nil, topo)
	none := func(string) string { return "" }
	fence := func(k string) string { return map[string]string{"holder_fence": "3"}[k] }
	for _, tc := range []struct {
		stage string
		rec   event.Record
		field func(string) string
		want  string
	}{
		{"triage", event.Record{EventType: event.StageDone, IssueKey: "RHEL-1001", Outcome: "rebase",
			Detail: `{"resolution":"rebase","stream":"ymir:rebase:c10s"}`}, none, "RHEL-1001 triaged → rebase c10s"},
		{"triage", event.Record{EventType: event.StageDone, IssueKey: "RHEL-1002", Outcome: "not-affected", Detail: `{}`}, none,
			"RHEL-1002 triaged: not-affected"},
		{"rebase-c9s", event.Record{EventType: event.StageDone, IssueKey: "RHEL-1004", Fence: "3", Outcome: "ymir_rebased"}, none,
			"RHEL-1004 rebase c9s done (fence 3)"},
		{"backport-c9s", event.Record{EventType: event.StageFailed, IssueKey: "RHEL-1005", Detail: `{"error":"build failed"}`}, none,
			"RHEL-1005 backport c9s failed: build failed"},
		{"triage", event.Record{EventType: event.LockDropped, IssueKey: "RHEL-1006"}, fence,
			"RHEL-1006 triage: dropped, the issue is held (fence 3)"},
		{"triage", event.Record{EventType: event.LockDelivered, IssueKey: "RHEL-1001"}, fence,
			"RHEL-1001 triage: a follow-up reached the running agent's mailbox (fence 3)"},
		{"triage", event.Record{EventType: event.FollowupDelivered, IssueKey: "RHEL-1001", Fence: "3",
			Detail: `{"followup_comment_id":"12","followup_author":"ann"}`}, none,
			"RHEL-1001 triage: the running agent acknowledged comment 12 by ann (fence 3)"},
		{"triage", event.Record{EventType: event.FollowupRolled, IssueKey: "RHEL-1001", Fence: "4",
			Detail: `{"followup_comment_id":"12","followup_author":"ann"}`}, none,
			"RHEL-1001 triage: comment 12 by ann met no live run: handed to this run in its Task JSON (fence 4)"},
		{"triage", event.Record{EventType: event.StageDone, IssueKey: "RHEL-1001", Outcome: "skipped",
			Detail: `{"reason":"already handled","followups_unseen":[{"followup_id":"9-0","followup_comment_id":"12","followup_author":"ann"}]}`}, none,
			"RHEL-1001 triage skipped: already handled; comment 12 by ann reached no agent (its run had ended)"},
	} {
		if got := devOutcomeLine(tally, tc.stage, tc.rec, tc.field); got != tc.want {
			t.Errorf("%s %s:\n got %q\nwant %q", tc.stage, tc.rec.EventType, got, tc.want)
		}
	}
}
