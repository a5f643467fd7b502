package webhook

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// hold publishes a request for key to (agent, branch, todo)'s stream and takes its
// lease for that entry, as a worker running it would; it returns the entry's message.
func (e *env) hold(agent, branch string, todo bool, key string) (string, *event.Task, string) {
	e.t.Helper()
	task := event.Task{}
	if agent == "triage" {
		_ = task.Set("issue", key)
	} else {
		_ = task.Set("jira_issue", key)
		_ = task.Set("target_branch", branch)
	}
	msg, err := event.New(event.RequestedEvent(agent), key, task, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	stream := e.topo.Stream(agent, branch, todo)
	id, err := event.NewPublisher(e.rdb, 0).PublishID(e.ctx, stream, msg)
	if err != nil {
		e.t.Fatal(err)
	}
	le, err := e.locker.Acquire(e.ctx, agent, key, lease.AcquireOptions{MessageID: id, Stream: stream})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _, _ = le.Release(e.ctx) })
	return stream, &task, msg.Metadata.Get(event.MetaCorrelationID)
}

// comments returns the comment.created entries of stream.
func (e *env) comments(stream string) []redis.XMessage {
	e.t.Helper()
	xs, err := e.rdb.XRange(e.ctx, stream, "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var out []redis.XMessage
	for _, x := range xs {
		if x.Values["m:"+event.MetaEventType] == event.CommentCreated {
			out = append(out, x)
		}
	}
	return out
}

// TestCommentBecomesFollowup: a maintainer's comment on an issue whose triage run holds
// its lease is published once, as comment.created, to the stream of the entry that run
// holds: the holder's Task as payload, its correlation id, the comment's id and author,
// and its body with ymirflow's secrets and credential-shaped text masked and cut to
// CommentMaxBytes. Jira's redelivery of it (a new delivery id) adds nothing; the agent
// account's own comment (written through the API) is never published.
func TestCommentBecomesFollowup(t *testing.T) {
	t.Parallel()
	const limit = 200
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")}, withConfig(func(c *Config) {
		c.CommentMaxBytes = limit
		c.Redactor = redact.New("jira-token-XYZ")
	}))
	_, task, corr := e.hold("triage", "", false, "RHEL-1")
	stream := e.topo.Stream("triage", "", true) // the twin of the run's stream
	text := "also update the tests; token jira-token-XYZ and ghp_0123456789abcdefghijABCDEFGHIJ\n" + strings.Repeat("é", 300)
	c, ok := e.jira.AddComment("RHEL-1", maintainer, text)
	if !ok {
		t.Fatal("no issue")
	}
	e.waitDeliveries()
	got := e.comments(stream)
	if len(got) != 1 {
		t.Fatalf("comment.created entries in %s: %d, want 1", stream, len(got))
	}
	msg := event.DecodeEntry(stream, got[0].ID, got[0].Values)
	md := msg.Metadata
	if md.Get(event.MetaCommentID) != c.ID || md.Get(event.MetaCommentAuthor) != maintainer.AccountID ||
		md.Get(event.MetaIssueKey) != "RHEL-1" || md.Get(event.MetaCorrelationID) != corr {
		t.Fatalf("metadata %v", md)
	}
	body := md.Get(event.MetaCommentBody)
	if len(body) > limit || !strings.HasSuffix(body, truncatedMark) || !strings.HasPrefix(body, "also update the tests") ||
		strings.Contains(body, "jira-token-XYZ") || strings.Contains(body, "ghp_") || !json.Valid([]byte(`"`+strings.ReplaceAll(body, "\n", `\n`)+`"`)) {
		t.Fatalf("body not redacted and bounded (%d bytes): %q", len(body), body)
	}
	var gotTask, wantTask map[string]any
	_ = json.Unmarshal(msg.Payload, &gotTask)
	b, _ := json.Marshal(task)
	_ = json.Unmarshal(b, &wantTask)
	if gotTask["metadata"].(map[string]any)["issue"] != "RHEL-1" {
		t.Fatalf("payload %s, want the holder's task %s", msg.Payload, b)
	}
	if _, err := event.Validate(msg, "triage", e.locker.Canonicalize); err != nil {
		t.Fatalf("the follow-up is not runnable by triage: %v", err)
	}

	// Jira sends the same comment again under another delivery id: one follow-up.
	is, _ := e.jira.Issue("RHEL-1")
	again, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": EventCommentCreated,
		"comment": map[string]any{"id": c.ID, "author": maintainer, "body": text}, "issue": map[string]any{"key": is.Key}})
	st, ans := e.post(again, signed(again, "another-delivery"))
	if st != http.StatusAccepted || ans["outcome"] != "followup_published" || ans["entry_id"] != got[0].ID {
		t.Fatalf("redelivery: %d %v (first entry %s)", st, ans, got[0].ID)
	}
	if n := len(e.comments(stream)); n != 1 {
		t.Fatalf("after a redelivery: %d comment.created entries, want 1", n)
	}

	// ymirflow's own account comments (the agent's report): Jira tells the webhook, the
	// receiver publishes nothing.
	if err := e.jc.AddComment(e.ctx, "RHEL-1", "triage done, see the labels"); err != nil {
		t.Fatal(err)
	}
	var own int
	for _, d := range e.waitDeliveries() {
		if d.Event == "comment_created" {
			own++
		}
	}
	if own != 2 {
		t.Fatalf("comment deliveries: %d, want 2", own)
	}
	if n := len(e.comments(stream)); n != 1 {
		t.Fatalf("own comment published: %d comment.created entries", n)
	}
	if n := e.metrics.Count(http.StatusAccepted, "own_account"); n != 1 {
		t.Fatalf("own_account count = %v, want 1", n)
	}
}

// TestCommentGoesToEachHolder: the follow-up goes to the twin of the stream of the
// entry each run holds (a downstream run on a :todo stream here, and triage on its main
// stream), and to no other; a
// comment on an issue nobody holds publishes nothing.
func TestCommentGoesToEachHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-2"), issue("RHEL-3")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	e.hold("rebase", "c10s", true, "RHEL-2")
	e.hold("triage", "", false, "RHEL-2")
	// Each to the twin of its run's stream: rebase:c10s for :todo, triage:todo for triage.
	rebase, triage := e.topo.Stream("rebase", "c10s", false), e.topo.Stream("triage", "", true)
	post := func(key, id string) map[string]string {
		body, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": EventCommentCreated,
			"comment": map[string]any{"id": id, "author": maintainer, "body": map[string]any{"type": "doc", "version": 1,
				"content": []any{map[string]any{"type": "paragraph", "content": []any{map[string]any{"type": "text", "text": "rebase onto 3.2"}}}}}},
			"issue": map[string]any{"key": key}})
		st, ans := e.post(body, signed(body, "d-"+id))
		if st != http.StatusAccepted {
			t.Fatalf("%s: %d %v", key, st, ans)
		}
		return ans
	}
	if ans := post("rhel-2", "20"); ans["outcome"] != "followup_published" || !strings.Contains(ans["detail"], "triage, rebase") {
		t.Fatalf("held issue: %v", ans)
	}
	for _, s := range []string{rebase, triage} {
		got := e.comments(s)
		if len(got) != 1 || got[0].Values["m:"+event.MetaCommentBody] != "rebase onto 3.2" {
			t.Fatalf("%s: %v", s, got)
		}
	}
	for _, s := range []string{e.topo.Stream("rebase", "c10s", true), e.topo.Stream("rebase", "c9s", false), e.topo.Stream("triage", "", false)} {
		if n := len(e.comments(s)); n != 0 {
			t.Fatalf("%s got %d follow-ups", s, n)
		}
	}
	if ans := post("RHEL-3", "30"); ans["outcome"] != "comment_no_run" {
		t.Fatalf("issue nobody holds: %v", ans)
	}
}

// TestCommentFindsTheHoldersEntryByItsStream: the run holds an entry of an agent's main
// stream whose id the :todo twin's entry of another issue has too (the two streams' ids
// repeat; the twin is read first). The follow-up is the holder's (its correlation id)
// and goes to the twin of the holder's stream, not to the holder's own.
func TestCommentFindsTheHoldersEntryByItsStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-4"), issue("RHEL-5")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	main, _, corr := e.hold("rebase", "c10s", false, "RHEL-4")
	held, err := e.rdb.XRevRangeN(e.ctx, main, "+", "-", 1).Result()
	if err != nil || len(held) != 1 {
		t.Fatalf("the held entry: %v %v", held, err)
	}
	todo := e.topo.Stream("rebase", "c10s", true)
	other, _ := event.New(event.RequestedEvent("rebase"), "RHEL-5", event.Task{}, nil)
	if err := e.rdb.XAdd(e.ctx, &redis.XAddArgs{Stream: todo, ID: held[0].ID, Values: event.Encode(other)}).Err(); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": EventCommentCreated,
		"comment": map[string]any{"id": "40", "author": maintainer, "body": "rebase onto 3.3"}, "issue": map[string]any{"key": "RHEL-4"}})
	if st, ans := e.post(body, signed(body, "d-40")); st != http.StatusAccepted || ans["outcome"] != "followup_published" {
		t.Fatalf("held issue: %d %v", st, ans)
	}
	got := e.comments(todo)
	if len(got) != 1 {
		t.Fatalf("follow-ups in %s (the twin of the holder's stream): %d, want 1; in %s: %d", todo, len(got), main, len(e.comments(main)))
	}
	if md := event.DecodeEntry(todo, got[0].ID, got[0].Values).Metadata; md.Get(event.MetaCorrelationID) != corr {
		t.Fatalf("the follow-up carries correlation id %q, want the holder's %q", md.Get(event.MetaCorrelationID), corr)
	}
}

// TestBadCommentPayloads: a comment_created without a comment id (nothing to make a
// redelivery one follow-up) or with an absurd one is malformed: 400, nothing stored.
func TestBadCommentPayloads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-4")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	e.hold("triage", "", false, "RHEL-4")
	for _, body := range []string{
		`{"webhookEvent":"comment_created","issue":{"key":"RHEL-4"}}`,
		`{"webhookEvent":"comment_created","comment":{"author":{"accountId":"maint"},"body":"x"},"issue":{"key":"RHEL-4"}}`,
		`{"webhookEvent":"comment_created","comment":{"id":" ","body":"x"},"issue":{"key":"RHEL-4"}}`,
		`{"webhookEvent":"comment_created","comment":{"id":"` + strings.Repeat("9", 65) + `"},"issue":{"key":"RHEL-4"}}`,
		`{"webhookEvent":"comment_created","comment":{"id":"1"}}`,
	} {
		if st, ans := e.post([]byte(body), signed([]byte(body), "")); st != http.StatusBadRequest {
			t.Errorf("%s: %d %v, want 400", body, st, ans)
		}
	}
	// An invalid key or a body that is neither a string nor a document: accepted, nothing run.
	for body, outcome := range map[string]string{
		`{"webhookEvent":"comment_created","comment":{"id":"5","body":"x"},"issue":{"key":"../x"}}`:                                     "skipped_invalid-key",
		`{"webhookEvent":"comment_created","comment":{"id":"6","body":12},"issue":{"key":"RHEL-4"}}`:                                    "followup_published",
		`{"webhookEvent":"comment_created","comment":{"id":"7","body":"ok","author":{"name":"ymirflow-bot"}},"issue":{"key":"RHEL-4"}}`: "own_account",
	} {
		if st, ans := e.post([]byte(body), signed([]byte(body), "")); st != http.StatusAccepted || ans["outcome"] != outcome {
			t.Errorf("%s: %d %v, want 202 %s", body, st, ans, outcome)
		}
	}
	got := e.comments(e.topo.Stream("triage", "", true))
	if len(got) != 1 || got[0].Values["m:"+event.MetaCommentBody] != "" {
		t.Fatalf("follow-ups %v, want one with an empty body", got)
	}
}
