package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/metric"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/webhook"
)

// The webhook receiver and the fetcher run as the pods' Redis user of base/secrets.yaml
// (redis-url): a delivery is stored in the inbox, classified, published, remembered and
// its retry dropped, a comment on a held issue is published as a follow-up, and a sweep's pre-check and publish pass, all without NOPERM.
func TestACLWebhookAndFetcherOnRealRedis(t *testing.T) {
	t.Parallel()
	w := newACLWebhookWorld(t)
	w.labelDelivery()
	w.commentOnAHeldIssue()
	s, err := w.f.Sweep(w.ctx)
	if err != nil {
		t.Fatalf("sweep as the pods' user: %v", err)
	}
	if !slices.Equal(s.PublishedKeys(), []string{"RHEL-2"}) {
		t.Errorf("sweep: %s", s)
	}
	if n := w.admin.XLen(w.ctx, w.todo).Val(); n != 1 {
		t.Errorf("%d entries on the todo stream", n)
	}
	w.budgetApproval()
}

// aclWebhookWorld is a fake Jira, a fetcher and a running webhook receiver on the pods'
// Redis user (redis-url) of a server with the users of base/secrets.yaml.
type aclWebhookWorld struct {
	t      *testing.T
	ctx    context.Context
	admin  *redis.Client
	rdb    redis.UniversalClient
	fj     *fakejira.Server
	jc     *jira.Client
	topo   event.Topology
	locker *lease.Locker
	f      *fetcher.Fetcher
	ts     *httptest.Server
	maint  jira.User
	todo   string
}

func newACLWebhookWorld(t *testing.T) *aclWebhookWorld {
	t.Helper()
	srv, sec := aclServer(t)
	w := &aclWebhookWorld{t: t, ctx: context.Background(), admin: srv.Client(), rdb: aclClient(t, srv, sec, "redis-url"),
		maint: jira.User{AccountID: "maint"}}
	ctx, rdb := w.ctx, w.rdb
	w.fj = fakejira.New(fakejira.Options{
		Issues: []fakejira.Issue{
			{Key: "RHEL-1", Labels: []string{"ymir_triaged_rebase"}, Updated: time.Now()},
			{Key: "RHEL-2", Updated: time.Now()},
		},
		Groups: map[string][]string{"maint": {"g"}},
	})
	jurl := w.fj.Start()
	t.Cleanup(w.fj.Close)
	jc, err := jira.New(jira.Options{BaseURL: jurl, Token: "t", RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	w.jc = jc
	topo := event.Topology{} // the deployed namespace, ymir
	w.topo, w.todo = topo, topo.Stream("triage", "", true)
	if w.locker, err = lease.New(rdb, lease.Options{Scope: topo.LockScope()}); err != nil {
		t.Fatal(err)
	}
	w.f, err = fetcher.New(fetcher.Config{Jira: jc, Redis: rdb, Topology: topo, Locker: w.locker, JQL: "project = RHEL",
		TriggerGroup: "g", MaxLen: 1000, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	rcv, err := webhook.New(webhook.Config{Fetcher: w.f, Jira: jc, Redis: rdb, Topology: topo, Secret: []byte("s"),
		JQL: "project = RHEL", Metrics: webhook.NewMetrics(metric.NewRegistry()), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	w.ts = httptest.NewServer(rcv)
	t.Cleanup(w.ts.Close)
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- rcv.Run(rctx) }() // classifies the stored deliveries, as the same user
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("receiver: %v", err)
		}
	})
	return w
}

// classified waits until cond holds (the receiver classified what), failing with the
// server's ACL LOG after 10 s.
func (w *aclWebhookWorld) classified(what string, cond func() bool) {
	t := w.t
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			log, _ := w.admin.Do(w.ctx, "ACL", "LOG", "5").Result()
			t.Fatalf("%s not classified as the pods' user\nACL LOG: %v", what, log)
		}
	}
}

// post delivers a signed webhook body with delivery id; it returns the status and the
// answer's "outcome detail".
func (w *aclWebhookWorld) post(body []byte, id string) (int, string) {
	t := w.t
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, w.ts.URL, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderSignature, webhook.Sign([]byte("s"), body))
	req.Header.Set(webhook.HeaderDelivery, id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	return resp.StatusCode, ans["outcome"] + " " + ans["detail"]
}

// labelDelivery: a maintainer's ymir_todo label is stored, classified, published and
// remembered; its retry is a duplicate.
func (w *aclWebhookWorld) labelDelivery() {
	t, ctx, admin, topo := w.t, w.ctx, w.admin, w.topo
	t.Helper()
	w.fj.ChangeLabels("RHEL-1", w.maint, []string{"ymir_todo"}, nil)
	is, err := w.jc.GetIssue(ctx, "RHEL-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var issue map[string]any
	_ = json.Unmarshal(is.Raw, &issue)
	body, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": "jira:issue_updated",
		"user": w.maint, "issue": issue, "changelog": map[string]any{"items": []map[string]any{
			{"field": "labels", "fromString": "ymir_triaged_rebase", "toString": "ymir_triaged_rebase ymir_todo"}}}})
	if st, out := w.post(body, "d1"); st != 202 || !strings.HasPrefix(out, "queued") {
		log, _ := admin.Do(ctx, "ACL", "LOG", "5").Result()
		t.Fatalf("delivery as the pods' user: %d %s\nACL LOG: %v", st, out, log)
	}
	w.classified("the delivery", func() bool {
		return admin.XLen(ctx, w.todo).Val() == 1 && admin.XLen(ctx, webhook.InboxStream(topo)).Val() == 0 &&
			admin.Exists(ctx, webhook.DeliveryKey(topo, "d1")).Val() == 1
	})
	if st, out := w.post(body, "d1"); st != 202 || !strings.HasPrefix(out, "duplicate") {
		t.Fatalf("retry as the pods' user: %d %s", st, out)
	}
}

// commentOnAHeldIssue: a triage run holds RHEL-1 (its entry on the :todo stream): a
// maintainer's comment becomes its follow-up, on the twin stream.
func (w *aclWebhookWorld) commentOnAHeldIssue() {
	t, ctx, admin, topo := w.t, w.ctx, w.admin, w.topo
	t.Helper()
	xs, err := admin.XRange(ctx, w.todo, "-", "+").Result()
	if err != nil || len(xs) != 1 {
		t.Fatalf("%s: %v %v", w.todo, xs, err)
	}
	le, err := w.locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: xs[0].ID})
	if err != nil {
		t.Fatalf("lease as the pods' user: %v", err)
	}
	comment := []byte(`{"timestamp":1,"webhookEvent":"comment_created","comment":{"id":"1","author":{"accountId":"maint"},"body":"also the tests"},"issue":{"key":"RHEL-1"}}`)
	if st, out := w.post(comment, "d2"); st != 202 || !strings.HasPrefix(out, "queued") {
		t.Fatalf("comment as the pods' user: %d %s", st, out)
	}
	main := topo.Stream("triage", "", false)
	w.classified("the comment", func() bool {
		return admin.XLen(ctx, main).Val() == 1 && admin.XLen(ctx, webhook.InboxStream(topo)).Val() == 0
	})
	if _, err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// budgetApproval: a maintainer's budget approval (issue 39): the raise, the parked
// request taken and published again, as the pods' user.
func (w *aclWebhookWorld) budgetApproval() {
	t, ctx, admin, topo := w.t, w.ctx, w.admin, w.topo
	t.Helper()
	ledger, err := agentctl.NewLedger(w.rdb, event.DefaultNamespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	rebase := topo.Stream("rebase", "c10s", false)
	if err := ledger.Park(ctx, "RHEL-1", agentctl.Parked{Agent: "rebase", Stream: rebase, EventType: event.RequestedEvent("rebase"),
		Payload: []byte(`{"metadata":{"jira_issue":"RHEL-1","target_branch":"c10s"}}`)}); err != nil {
		t.Fatalf("park as the pods' user: %v", err)
	}
	approval := []byte(`{"timestamp":1,"webhookEvent":"comment_created","comment":{"id":"2","author":{"accountId":"maint"},"body":"/ymir budget +5"},"issue":{"key":"RHEL-1"}}`)
	if st, out := w.post(approval, "d3"); st != 202 || !strings.HasPrefix(out, "queued") {
		t.Fatalf("approval as the pods' user: %d %s", st, out)
	}
	w.classified("the approval", func() bool {
		c, err := ledger.Costs(ctx, "RHEL-1")
		return err == nil && c.RaisedUSD == 5 && admin.XLen(ctx, rebase).Val() == 1 && admin.XLen(ctx, webhook.InboxStream(topo)).Val() == 0
	})
}
