package fakejira

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// received is one delivery as the receiver saw it.
type received struct {
	header http.Header
	body   []byte
}

// A label change through the API and an issue created through the API are delivered signed,
// shaped as Jira's, by the acting user; a failed delivery is retried with the same id.
func TestWebhookDeliveries(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []received
	fail := 1
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, received{r.Header.Clone(), b})
		if fail > 0 {
			fail--
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hook.Close()
	s := New(Options{Issues: []Issue{{Key: "RHEL-1", Labels: []string{"a"}}},
		Webhooks: []WebhookTarget{{URL: hook.URL, Secret: "k"}}, WebhookRetryDelay: time.Millisecond})
	base := s.Start()
	defer s.Close()
	c, err := jira.New(jira.Options{BaseURL: base, Token: "t", RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.UpdateLabels(ctx, "RHEL-1", []string{"ymir_todo"}, nil); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/rest/api/2/issue", strings.NewReader(`{"fields":{"project":{"key":"RHEL"},"summary":"new","labels":["x"]}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderActAs, "maint")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || created["key"] != "RHEL-2" {
		t.Fatalf("create: %d %v", resp.StatusCode, created)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.WaitWebhooks(wctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("%d requests, want 3 (one retried)", len(got))
	}
	ids := map[string]int{}
	events := map[string]map[string]any{}
	for _, r := range got {
		m := hmac.New(sha256.New, []byte("k"))
		m.Write(r.body)
		if r.header.Get("X-Hub-Signature") != "sha256="+hex.EncodeToString(m.Sum(nil)) {
			t.Errorf("bad signature %q", r.header.Get("X-Hub-Signature"))
		}
		ids[r.header.Get("X-Atlassian-Webhook-Identifier")]++
		var p map[string]any
		if err := json.Unmarshal(r.body, &p); err != nil {
			t.Fatal(err)
		}
		events[p["webhookEvent"].(string)] = p
	}
	if len(ids) != 2 {
		t.Errorf("delivery ids %v: want 2, the retry keeping its id", ids)
	}
	upd := events["jira:issue_updated"]
	if upd == nil || upd["user"].(map[string]any)["accountId"] != DefaultUser.AccountID || upd["timestamp"] == nil {
		t.Fatalf("issue_updated %v", upd)
	}
	items := upd["changelog"].(map[string]any)["items"].([]any)
	it := items[0].(map[string]any)
	if it["field"] != "labels" || it["fromString"] != "a" || it["toString"] != "a ymir_todo" {
		t.Errorf("changelog item %v", it)
	}
	if labels := upd["issue"].(map[string]any)["fields"].(map[string]any)["labels"].([]any); len(labels) != 2 {
		t.Errorf("issue labels %v", labels)
	}
	cr := events["jira:issue_created"]
	if cr == nil || cr["user"].(map[string]any)["accountId"] != "maint" || cr["issue"].(map[string]any)["key"] != "RHEL-2" {
		t.Fatalf("issue_created %v", cr)
	}
	ds := s.Deliveries()
	if len(ds) != 2 {
		t.Fatalf("deliveries %+v", ds)
	}
	for _, d := range ds {
		if d.Status != http.StatusAccepted {
			t.Errorf("delivery %+v", d)
		}
	}
}

// Comments are delivered as Jira's comment_created: one written in the UI (AddComment)
// by its author, and one written through the API by the acting user (ymirflow's own
// account by default), each with the comment's id, author and body and the issue's key.
func TestCommentWebhooks(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []map[string]any
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hook.Close()
	bot := jira.User{AccountID: "bot", Name: "bot"}
	s := New(Options{Issues: []Issue{{Key: "RHEL-1"}}, CurrentUser: bot, Webhooks: []WebhookTarget{{URL: hook.URL}}})
	base := s.Start()
	defer s.Close()
	c, err := jira.New(jira.Options{BaseURL: base, Token: "t", RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ui, ok := s.AddComment("rhel-1", jira.User{AccountID: "ann"}, "also the tests")
	if !ok {
		t.Fatal("no issue")
	}
	if _, ok := s.AddComment("RHEL-9", jira.User{AccountID: "ann"}, "x"); ok {
		t.Fatal("a comment on an unknown issue")
	}
	if err := c.AddComment(ctx, "RHEL-1", "ymirflow: done"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.WaitWebhooks(wctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d deliveries, want 2", len(got))
	}
	authors := map[string]string{}
	for _, d := range got {
		cm, _ := d["comment"].(map[string]any)
		is, _ := d["issue"].(map[string]any)
		a, _ := cm["author"].(map[string]any)
		if d["webhookEvent"] != "comment_created" || is["key"] != "RHEL-1" || cm["id"] == "" {
			t.Fatalf("delivery %v", d)
		}
		authors[a["accountId"].(string)] = cm["body"].(string)
		if a["accountId"] == "ann" && cm["id"] != ui.ID {
			t.Errorf("comment id %v, want %s", cm["id"], ui.ID)
		}
	}
	if authors["ann"] != "also the tests" || authors["bot"] != "ymirflow: done" {
		t.Fatalf("comments by author %v", authors)
	}
	if n := len(s.Comments("RHEL-1")); n != 2 {
		t.Fatalf("%d comments stored", n)
	}
}
