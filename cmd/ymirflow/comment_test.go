package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/webhook"
)

// Issue 24 item 1: a maintainer's comment in Jira, while the example agent runs the
// issue, reaches the agent's YMIR_MAILBOX through `ymirflow webhook` and a real worker
// (ON_CONFLICT=comment.created=deliver,*=drop): author and comment id kept, ymirflow's
// Jira token and a pasted GitHub token masked, the text cut to
// WEBHOOK_COMMENT_MAX_BYTES. The comment ymirflow's own account writes meanwhile is
// never delivered, and Jira's redelivery of the maintainer's comment (another delivery
// id) is not a second follow-up: the agent sees exactly one, acknowledges it, and the
// issue has one run.
func TestCommentReachesRunningAgent(t *testing.T) {
	// Not parallel: the commands read their settings from the environment (t.Setenv).
	py := kitAgents(t)[0]
	admin, topo, dir := kitWorld(t, "5000")
	const (
		issue   = "RHEL-904"
		token   = "kit-token-0042"
		secret  = "hook-secret"
		limit   = 160
		pasted  = "ghp_0123456789abcdefghijABCDEFGHIJ"
		botID   = "ymirflow-bot"
		comment = "also update the tests (my token " + pasted + ", the bot's " + token + ")"
	)
	bot := jira.User{AccountID: botID, Name: botID}
	hookURL := "http://127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) + "/"
	srv := fakejira.New(fakejira.Options{Token: token, CurrentUser: bot,
		Issues:   []fakejira.Issue{{Key: issue, Summary: "s", Labels: []string{}}},
		Webhooks: []fakejira.WebhookTarget{{URL: hookURL, Secret: secret}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wout, werr, hout, herr testlog.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s%s\nwebhook log:\n%s%s", wout.String(), werr.String(), hout.String(), herr.String())
		}
	})
	codes := make(chan int, 2)
	go func() {
		codes <- run(ctx, []string{"worker", "--agent", "triage", "--runner", "exec", "--exec", py.command,
			"--runner-env", "AGENT_*", "--ymir-namespace", topo.Namespace, "--metrics-addr", "",
			"--on-conflict", "comment.created=deliver,*=drop", "--jira-url", ts.URL, "--jira-token", token,
			"--jira-rate-limit", "-1", "--block-time", "200ms", "--consumer-name", "w1"}, &wout, &werr)
	}()
	go func() {
		codes <- run(ctx, []string{"webhook", "--addr", strings.TrimSuffix(strings.TrimPrefix(hookURL, "http://"), "/"),
			"--metrics-addr", "", "--jira-url", ts.URL, "--jira-token", token, "--jira-rate-limit", "-1",
			"--jira-jql", "project = RHEL", "--webhook-secret", secret, "--webhook-comment-max-bytes", strconv.Itoa(limit),
			"--ymir-namespace", topo.Namespace, "--log-level", "debug"}, &hout, &herr)
	}()
	waitOut(t, &hout, &herr, regexp.MustCompile(`receiving Jira webhooks at (\S+) \(signed`))

	publishFollowup(t, admin, topo, issue, "", "", "") // the run: a triage request on the main stream
	trace := filepath.Join(dir, "triage", "mailbox-"+issue+".log")
	lines := func() []string {
		b, _ := os.ReadFile(trace)
		if len(b) == 0 {
			return nil
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	redistest.Eventually(t, 20*time.Second, func() bool { return len(lines()) == 1 }, "the agent runs and reads its mailbox")

	// ymirflow's own account comments first (as a handler reporting would), then the
	// maintainer; the receiver classifies deliveries in order.
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/rest/api/2/issue/"+issue+"/comment", strings.NewReader(`{"body":"ymirflow: triage started"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	c, _ := srv.AddComment(issue, jira.User{AccountID: "ann", Name: "ann"}, comment+strings.Repeat(" more", 100))
	redistest.Eventually(t, 10*time.Second, func() bool { return len(lines()) == 2 }, "the comment reached the agent's mailbox")
	var fu map[string]string
	if err := json.Unmarshal([]byte(lines()[1]), &fu); err != nil || fu["id"] == "" {
		t.Fatalf("the agent's second mailbox line %q (%v) is not the follow-up", lines()[1], err)
	}
	body := fu["body"]
	if fu["author"] != "ann" || fu["comment_id"] != c.ID || fu["event_type"] != event.CommentCreated ||
		!strings.HasPrefix(body, "also update the tests") || strings.Contains(body, pasted) || strings.Contains(body, token) ||
		len(body) > limit || !strings.HasSuffix(body, "[truncated]") {
		t.Fatalf("mailbox line %v (body %d bytes)", fu, len(body))
	}

	// Jira delivers the maintainer's comment again, under another delivery id.
	again, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": "comment_created",
		"comment": map[string]any{"id": c.ID, "author": map[string]string{"accountId": "ann"}, "body": comment},
		"issue":   map[string]any{"key": issue}})
	req, _ = http.NewRequest(http.MethodPost, hookURL, bytes.NewReader(again))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderSignature, webhook.Sign([]byte(secret), again))
	req.Header.Set(webhook.HeaderDelivery, "redelivery-1")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("redelivery answered %d", resp.StatusCode)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return admin.XLen(ctx, webhook.InboxStream(topo)).Val() == 0 &&
			strings.Contains(herr.String(), `"delivery":"redelivery-1"`)
	}, "the redelivery classified")

	redistest.Eventually(t, 30*time.Second, func() bool {
		return len(records(ctx, admin, topo, event.StageDone, issue)) == 1 &&
			len(records(ctx, admin, topo, event.FollowupDelivered, issue)) == 1
	}, "the run ends with the comment delivered")
	time.Sleep(500 * time.Millisecond) // a window for a wrong extra run or delivery to show
	cancel()
	for range 2 {
		select {
		case code := <-codes:
			if code != 0 {
				t.Fatalf("a command exited %d", code)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a command did not stop")
		}
	}
	if got := lines(); len(got) != 2 {
		t.Errorf("the agent's mailbox saw %d lines, want the run's start and one follow-up: %q", len(got), got)
	}
	bg := context.Background()
	if n := len(records(bg, admin, topo, event.StageDone, issue)); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
	if n := len(records(bg, admin, topo, event.LockDelivered, issue)); n != 1 {
		t.Errorf("%d lock.delivered records, want 1 (the redelivery and the bot's comment are none)", n)
	}
	rec := records(bg, admin, topo, event.FollowupDelivered, issue)[0]
	if !strings.Contains(rec.Values["detail"].(string), `"followup_comment_id":"`+c.ID+`"`) {
		t.Errorf("followup.delivered %v does not name comment %s", rec.Values, c.ID)
	}
	if !strings.Contains(herr.String(), `"outcome":"own_account"`) {
		t.Errorf("the bot's comment was not ignored as ymirflow's own")
	}
}
