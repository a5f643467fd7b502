package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The end-to-end path: a maintainer adds ymir_todo in the fake Jira, whose signed webhook
// puts exactly one triage request on the :todo stream and flips the label; the flip's own
// webhook (by ymirflow's account) is ignored.
func TestMaintainerTodoEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1", "ymir_triaged_rebase")})
	e.jira.ChangeLabels("RHEL-1", maintainer, []string{labels.Todo}, nil)
	eventually(t, 20*time.Second, "label flipped", func() bool {
		return slices.Contains(e.jira.Labels("RHEL-1"), labels.TriageInProgress)
	})
	ds := e.waitDeliveries()
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-1@todo"}) {
		t.Fatalf("entries %v\n%s", got, e.logs)
	}
	if got := e.labels("RHEL-1"); slices.Contains(got, labels.Todo) {
		t.Errorf("labels %v: ymir_todo not consumed", got)
	}
	// A delivery is answered once it is in the inbox and classified after: the second
	// one's classification may still be under way.
	eventually(t, 20*time.Second, "both deliveries classified", func() bool {
		return e.metrics.Count(202, "published")+e.metrics.Count(202, "own_account") >= 2
	})
	if len(ds) != 2 || e.metrics.Count(202, "published") != 1 || e.metrics.Count(202, "own_account") != 1 {
		t.Errorf("deliveries %+v; published %v, own %v", ds, e.metrics.Count(202, "published"), e.metrics.Count(202, "own_account"))
	}
	for _, d := range ds {
		if d.Status != http.StatusAccepted || d.Attempts != 1 {
			t.Errorf("delivery %+v", d)
		}
	}
}

func TestSignature(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")}, withFake(func(o *fakejira.Options) {
		o.Webhooks = []fakejira.WebhookTarget{} // deliveries are made by hand here
	}))
	body := e.event("RHEL-1", maintainer)
	good := Sign([]byte(secret), body)
	for _, c := range []struct {
		name, sig string
		status    int
		outcome   string
	}{
		{"missing", "", 401, "bad_signature_missing"},
		{"wrong secret", Sign([]byte("other"), body), 401, "bad_signature_mismatch"},
		{"other body", Sign([]byte(secret), append(body, ' ')), 401, "bad_signature_mismatch"},
		{"sha1 prefix", "sha1=" + strings.TrimPrefix(good, "sha256="), 401, "bad_signature_algorithm"},
		{"no prefix", strings.TrimPrefix(good, "sha256="), 401, "bad_signature_algorithm"},
		{"not hex", "sha256=zz" + good[9:], 401, "bad_signature_malformed"},
		{"truncated", good[:len(good)-2], 401, "bad_signature_malformed"},
	} {
		st, ans := e.post(body, map[string]string{HeaderSignature: c.sig})
		if st != c.status || ans["outcome"] != c.outcome {
			t.Errorf("%s: %d %v, want %d %s", c.name, st, ans, c.status, c.outcome)
		}
		if n := e.metrics.Count(c.status, c.outcome); n == 0 {
			t.Errorf("%s: not counted", c.name)
		}
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("a badly signed delivery published %v", got)
	}
	if st, ans := e.post(body, map[string]string{HeaderSignature: good}); st != 202 || ans["outcome"] != "published" {
		t.Fatalf("good signature: %d %v\n%s", st, ans, e.logs)
	}
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-1@triage"}) {
		t.Fatalf("entries %v", got)
	}
}

// Without a secret New refuses, unless unsigned deliveries are allowed explicitly; then an
// unsigned delivery is taken.
func TestNoSecretRefusesToStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }),
		withConfig(func(c *Config) { c.Secret, c.InsecureNoSignature = nil, true }))
	cfg := e.rcv.cfg
	cfg.InsecureNoSignature = false
	if _, err := New(cfg); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("New without a secret: %v", err)
	}
	body := e.event("RHEL-1", maintainer)
	if st, ans := e.post(body, nil); st != 202 || ans["outcome"] != "published" {
		t.Fatalf("unsigned delivery with InsecureNoSignature: %d %v", st, ans)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	big := []byte(`{"webhookEvent":"jira:issue_updated","pad":"` + strings.Repeat("x", DefaultMaxBody) + `"}`)
	for _, c := range []struct {
		name    string
		body    []byte
		method  string
		ctype   string
		status  int
		outcome string
	}{
		{"oversized", big, "POST", "application/json", 413, "too_large"},
		{"not JSON", []byte(`{"webhookEvent":`), "POST", "application/json", 400, "malformed"},
		{"no event", []byte(`{"issue":{"key":"RHEL-1"}}`), "POST", "application/json", 400, "malformed"},
		{"issue without key", []byte(`{"webhookEvent":"jira:issue_updated","issue":{}}`), "POST", "application/json", 400, "malformed"},
		{"GET", nil, "GET", "application/json", 405, "method_not_allowed"},
		{"text", []byte(`{}`), "POST", "text/plain", 415, "unsupported_media_type"},
	} {
		before := e.metrics.Count(c.status, c.outcome)
		req, _ := http.NewRequest(c.method, e.url, strings.NewReader(string(c.body)))
		req.Header.Set("Content-Type", c.ctype)
		req.Header.Set(HeaderSignature, Sign([]byte(secret), c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status || e.metrics.Count(c.status, c.outcome) != before+1 {
			t.Errorf("%s: %d (counted %v), want %d %s", c.name, resp.StatusCode, e.metrics.Count(c.status, c.outcome)-before, c.status, c.outcome)
		}
	}
	// A chunked body (no Content-Length) above the bound is cut off while read.
	req, _ := http.NewRequest("POST", e.url, struct{ *strings.Reader }{strings.NewReader(string(big))})
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("chunked oversized: %d", resp.StatusCode)
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("published %v", got)
	}
}

// Jira's retry of a delivery already handled is answered 202 and not handled again.
func TestDuplicateDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1"), issue("RHEL-2")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	body := e.event("RHEL-1", maintainer)
	if st, ans := e.post(body, signed(body, "d-1")); st != 202 || ans["outcome"] != "published" {
		t.Fatalf("first: %d %v", st, ans)
	}
	// The worker took and finished it: a second handling would publish again.
	e.rdb.Del(e.ctx, e.topo.Queued("triage", "RHEL-1"))
	e.rdb.Del(e.ctx, e.topo.Stream("triage", "", false))
	if st, ans := e.post(body, signed(body, "d-1")); st != 202 || ans["outcome"] != "duplicate" {
		t.Fatalf("retry: %d %v", st, ans)
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("the retry published %v", got)
	}
	if ttl := e.rdb.TTL(e.ctx, DeliveryKey(e.topo, "d-1")).Val(); ttl < 23*time.Hour || ttl > 24*time.Hour {
		t.Errorf("delivery remembered for %s, want 24h", ttl)
	}
	// Another delivery id is handled.
	body2 := e.event("RHEL-2", maintainer)
	if st, ans := e.post(body2, signed(body2, "d-2")); st != 202 || ans["outcome"] != "published" {
		t.Fatalf("d-2: %d %v", st, ans)
	}
}

// Events caused by ymirflow's own account (its flips) start nothing, and are counted.
func TestOwnAccountIgnored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")})
	e.jira.ChangeLabels("RHEL-1", jira.User{AccountID: botID, Name: botID}, []string{labels.RetryNeeded}, nil)
	ds := e.waitDeliveries()
	if len(ds) != 1 || ds[0].Status != 202 || e.metrics.Count(202, "own_account") != 1 {
		t.Fatalf("deliveries %+v, own %v", ds, e.metrics.Count(202, "own_account"))
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("an own event published %v", got)
	}
}

// ymir_todo added by someone outside the trigger group is removed, nothing published.
func TestUntrustedTodo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1", "ymir_triaged_rebase")})
	e.jira.ChangeLabels("RHEL-1", outsider, []string{labels.Todo}, nil)
	eventually(t, 20*time.Second, "untrusted ymir_todo removed", func() bool {
		return !slices.Contains(e.jira.Labels("RHEL-1"), labels.Todo)
	})
	e.waitDeliveries()
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("published %v", got)
	}
	if e.metrics.Count(202, "skipped_untrusted") != 1 {
		t.Errorf("not counted as untrusted\n%s", e.logs)
	}
}

// A locked issue keeps its trigger, nothing is published; the next sweep after the release
// publishes it.
func TestLockedIssueKeepsTrigger(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1", "ymir_triaged_rebase")})
	le, err := e.locker.Acquire(e.ctx, "rebase", "RHEL-1", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.jira.ChangeLabels("RHEL-1", maintainer, []string{labels.Todo}, nil)
	ds := e.waitDeliveries()
	// The answer (202) comes before the classification; the drained inbox says it is done.
	// Polled all the same: a count is no place to learn an order from.
	eventually(t, 20*time.Second, "the delivery classified", func() bool { return e.metrics.Count(202, "skipped_locked") >= 1 })
	if len(ds) != 1 || ds[0].Status != 202 || e.metrics.Count(202, "skipped_locked") != 1 {
		t.Fatalf("deliveries %+v, skipped_locked %v\n%s", ds, e.metrics.Count(202, "skipped_locked"), e.logs)
	}
	if got := e.entries(); len(got) != 0 || !slices.Contains(e.labels("RHEL-1"), labels.Todo) {
		t.Fatalf("locked: entries %v, labels %v", got, e.labels("RHEL-1"))
	}
	if _, err := le.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	s, err := e.fetcher.Sweep(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-1@todo"}) {
		t.Fatalf("after the release: %v (%s)", got, s)
	}
}

// Redis down: the delivery is answered 503 and nothing is acknowledged; Jira's retry after
// Redis is back publishes it, once.
func TestRedisDownThenRetry(t *testing.T) {
	// Not parallel: it stops its own redis-server and counts on a 2 s answer deadline and the fake Jira's 200 ms redelivery delay.
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rdb := srv.Client()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1", "ymir_triaged_rebase")}, withRedis(rdb, "wh:"),
		withFake(func(o *fakejira.Options) { o.WebhookRetries, o.WebhookRetryDelay = 8, 200*time.Millisecond }),
		withConfig(func(c *Config) { c.Deadline = 2 * time.Second }))
	srv.Stop()
	e.jira.ChangeLabels("RHEL-1", maintainer, []string{labels.Todo}, nil)
	eventually(t, 20*time.Second, "a 503 while Redis is down", func() bool {
		return e.metrics.Count(503, "redis_unavailable") > 0
	})
	if !slices.Contains(e.labels("RHEL-1"), labels.Todo) {
		t.Fatalf("a label was flipped without a publish: %v", e.labels("RHEL-1"))
	}
	srv.Start()
	ds := e.waitDeliveries()
	var todo fakejira.Delivery
	for _, d := range ds {
		if d.Key == "RHEL-1" && d.Event == EventIssueUpdated && d.Attempts > 1 {
			todo = d
		}
	}
	if todo.Status != 202 {
		t.Fatalf("the retried delivery ended %+v (all: %+v)\n%s", todo, ds, e.logs)
	}
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-1@todo"}) {
		t.Fatalf("entries %v", got)
	}
	if !slices.Contains(e.labels("RHEL-1"), labels.TriageInProgress) {
		t.Errorf("labels %v", e.labels("RHEL-1"))
	}
}

// Webhook deliveries (several copies with distinct ids, as several registrations would
// send) and sweeps racing on the same issue publish it once.
func TestWebhookAndSweepRacePublishOnce(t *testing.T) {
	t.Parallel()
	const n = 8
	var keys []string
	var issues []fakejira.Issue
	for i := range 10 {
		k := "RHEL-" + strconv.Itoa(i+1)
		keys = append(keys, k)
		issues = append(issues, issue(k, "ymir_triaged_rebase", labels.Todo))
	}
	e := newEnv(t, issues, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	// The maintainer's adds, as the changelog the sweep's author check reads.
	for _, k := range keys {
		e.jira.ChangeLabels(k, maintainer, nil, []string{labels.Todo})
		e.jira.ChangeLabels(k, maintainer, []string{labels.Todo}, nil)
	}
	bodies := map[string][]byte{}
	for _, k := range keys {
		bodies[k] = e.event(k, maintainer, labels.Todo)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for _, k := range keys {
				b := bodies[k]
				if st, ans := e.post(b, signed(b, k+"-"+strconv.Itoa(i))); st != 202 {
					errs <- k + ": " + strconv.Itoa(st) + " " + ans["outcome"]
				}
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := e.fetcher.Sweep(e.ctx); err != nil {
				errs <- err.Error()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := e.entries()
	var want []string
	for _, k := range keys {
		want = append(want, k+"@todo")
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("entries %v, want each issue once", got)
	}
}

// A delivery older than the payload age (a retry) is not trusted: the issue is read from
// Jira, and a trigger already consumed there starts nothing.
func TestStalePayloadReadsJira(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1", "ymir_triaged_rebase", labels.Todo)},
		withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }),
		withConfig(func(c *Config) { c.Clock = func() time.Time { return time.Now().Add(time.Minute) } }))
	body := e.event("RHEL-1", maintainer, labels.Todo)
	e.jira.ChangeLabels("RHEL-1", maintainer, nil, []string{labels.Todo}) // gone since
	if st, ans := e.post(body, signed(body, "old")); st != 202 || ans["outcome"] != "skipped_labelled" {
		t.Fatalf("stale delivery: %d %v", st, ans)
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("published %v", got)
	}
}

// Issues outside JIRA_JQL are not acted on; a comment on an issue no run holds starts nothing.
func TestScopeAndComments(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }))
	body := []byte(`{"timestamp":1,"webhookEvent":"jira:issue_created","user":{"accountId":"maint"},"issue":{"key":"OTHER-9","fields":{"labels":[]}}}`)
	if st, ans := e.post(body, signed(body, "")); st != 202 || ans["outcome"] != "out_of_scope" {
		t.Fatalf("out of scope: %d %v", st, ans)
	}
	body = []byte(`{"timestamp":1,"webhookEvent":"comment_created","comment":{"id":"10","author":{"accountId":"maint"}},"issue":{"key":"RHEL-1","fields":{}}}`)
	if st, ans := e.post(body, signed(body, "")); st != 202 || ans["outcome"] != "comment_no_run" {
		t.Fatalf("comment on an issue no run holds: %d %v", st, ans)
	}
	body = []byte(`{"timestamp":1,"webhookEvent":"jira:issue_deleted","issue":{"key":"RHEL-1"}}`)
	if st, ans := e.post(body, signed(body, "")); st != 202 || ans["outcome"] != "ignored_event" {
		t.Fatalf("deleted: %d %v", st, ans)
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("published %v", got)
	}
}

// A Jira that does not answer does not hold the delivery: it is stored and answered 202
// at once; its classification times out (ProcessTimeout), leaves it pending and
// unremembered, and it is classified again after RetryAfter, when Jira answers.
func TestSlowJiraDoesNotDelayTheAnswer(t *testing.T) {
	// Not parallel: it bounds the receiver's answer time (200 ms), which other tests' CPU on a 2-core CI machine would blow.
	var slowMode atomic.Bool
	slowMode.Store(true)
	release := make(chan struct{})
	var fake *fakejira.Server
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slowMode.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { close(release); slow.Close() })
	const timeout = 300 * time.Millisecond
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1")}, withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }),
		withConfig(func(c *Config) {
			jc, err := jira.New(jira.Options{BaseURL: slow.URL, Token: "t", RateLimit: -1, MaxRetries: 0, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			c.Jira, c.ProcessTimeout, c.RetryAfter = jc, timeout, 2*timeout
		}))
	fake = e.jira
	body := e.event("RHEL-1", maintainer)
	// A payload the rules cannot trust (no changelog, old): the issue is read from Jira.
	body = []byte(strings.Replace(string(body), `"timestamp":`, `"timestamp":1,"x":`, 1))
	start := time.Now()
	st, ans := e.postRaw(body, signed(body, "slow-1"))
	if took := time.Since(start); st != http.StatusAccepted || ans["outcome"] != "queued" || took > 200*time.Millisecond {
		t.Fatalf("slow Jira: %d %v after %s, want 202 queued at once", st, ans, took)
	}
	eventually(t, 10*time.Second, "a timed-out classification", func() bool { return e.metrics.Count(503, "timeout") > 0 })
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("published %v", got)
	}
	if n := e.rdb.Exists(e.ctx, DeliveryKey(e.topo, "slow-1")).Val(); n != 0 {
		t.Error("a delivery that failed was remembered: its retry would be dropped")
	}
	if n := e.rdb.XLen(e.ctx, InboxStream(e.topo)).Val(); n != 1 {
		t.Fatalf("inbox holds %d entries, want the failed delivery", n)
	}
	slowMode.Store(false) // Jira answers again: the retry publishes
	e.drain(30 * time.Second)
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-1@triage"}) {
		t.Fatalf("entries after Jira came back: %v\n%s", got, e.logs)
	}
}

// A delivery stored by a receiver that died before classifying it (unread, or read and
// left pending) is classified by the next receiver: nothing Jira was told 202 for is
// lost.
func TestStoredDeliveriesSurviveTheReceiver(t *testing.T) {
	// Not parallel: it times a 200 ms processing timeout and a 400 ms Retry-After.
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1"), issue("RHEL-2")}, withoutRun(),
		withFake(func(o *fakejira.Options) { o.Webhooks = []fakejira.WebhookTarget{} }),
		withConfig(func(c *Config) { c.ProcessTimeout, c.RetryAfter = 200*time.Millisecond, 400*time.Millisecond }))
	var ids []string
	for _, k := range []string{"RHEL-1", "RHEL-2"} {
		b := e.event(k, maintainer)
		st, ans := e.postRaw(b, signed(b, "d-"+k))
		if st != http.StatusAccepted || ans["outcome"] != "queued" {
			t.Fatalf("%s: %d %v", k, st, ans)
		}
		ids = append(ids, ans["inbox_id"])
	}
	// The dead process had read the first one (pending on its consumer) and died.
	inbox := InboxStream(e.topo)
	e.rdb.XGroupCreateMkStream(e.ctx, inbox, InboxGroup, "0")
	if n := len(e.rdb.XReadGroup(e.ctx, &redis.XReadGroupArgs{Group: InboxGroup, Consumer: "dead", Streams: []string{inbox, ">"}, Count: 1}).Val()); n != 1 {
		t.Fatal("the dead consumer read nothing")
	}
	if got := e.entries(); len(got) != 0 {
		t.Fatalf("published before any receiver classified: %v", got)
	}
	e.run(t) // the next receiver
	e.drain(30 * time.Second)
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-1@triage", "RHEL-2@triage"}) {
		t.Fatalf("entries %v\n%s", got, e.logs)
	}
	for _, id := range ids {
		e.mu.Lock()
		res, ok := e.processed[id]
		e.mu.Unlock()
		if !ok || res.outcome != "published" {
			t.Errorf("inbox entry %s: %+v", id, res)
		}
	}
}

// An issue created in Jira (jira:issue_created) is a fresh issue: published to the backlog
// stream as a sweep would; one created with ymir_todo has no changelog naming who added it,
// so, as in a sweep, the label is untrusted and removed.
func TestIssueCreated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.jira.CreateIssue(issue("RHEL-5"), maintainer)
	e.jira.CreateIssue(issue("RHEL-6", "ymir_triaged_rebase", labels.Todo), maintainer)
	ds := e.waitDeliveries()
	if got := e.entries(); !slices.Equal(got, []string{"RHEL-5@triage"}) {
		t.Fatalf("entries %v (deliveries %+v)\n%s", got, ds, e.logs)
	}
	if e.metrics.Count(202, "published") != 1 || e.metrics.Count(202, "skipped_untrusted") != 1 {
		t.Errorf("published %v, untrusted %v", e.metrics.Count(202, "published"), e.metrics.Count(202, "skipped_untrusted"))
	}
	if got := e.labels("RHEL-6"); slices.Contains(got, labels.Todo) {
		t.Errorf("RHEL-6 labels %v", got)
	}
	created := 0
	for _, d := range ds {
		if d.Event == EventIssueCreated {
			created++
		}
	}
	if created != 2 {
		t.Errorf("%d jira:issue_created deliveries, want 2", created)
	}
}

// Jira calls before the publish wait their turn under JIRA_RATE_LIMIT, so a delivery
// makes as few as its payload allows (issue 35 item 12): none when the rules act on
// nothing in it; one, the scope search, for a maintainer's ymir_todo (plus the group read
// the first time), also when the payload lacks a field the rules read (the search brings
// it); one for a retry (the search brings every field). Counted at the fake Jira.
func TestFewJiraCallsBeforeThePublish(t *testing.T) {
	t.Parallel()
	full := func(is fakejira.Issue) fakejira.Issue {
		is.Fields = map[string]any{fetcher.DefaultComponentField: nil} // Jira sends an unset field as null
		return is
	}
	e := newEnv(t, []fakejira.Issue{full(issue("RHEL-1", "ymir_triaged_rebase")), full(issue("RHEL-2", "ymir_triaged_rebase")),
		issue("RHEL-3", "ymir_triaged_rebase"), full(issue("RHEL-4", "ymir_triaged_rebase")), todoByMaintainer(issue("RHEL-5", "ymir_triaged_rebase"))})
	reads := func() int {
		n := 0
		for _, r := range e.jira.Requests() {
			if r.Method != http.MethodPut { // the label flip comes after the publish
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		name, key, label, outcome string
		reads                     int
	}{
		{"first ymir_todo of a maintainer: scope search, group read", "RHEL-1", labels.Todo, "published", 2},
		{"the maintainer again: scope search", "RHEL-2", labels.Todo, "published", 1},
		{"a payload without the component field: the scope search brings it", "RHEL-3", labels.Todo, "published", 1},
		{"a label the rules do not act on: no call", "RHEL-4", "cve-2026-1", "skipped_labelled", 0},
	} {
		before, published := reads(), e.metrics.Count(202, c.outcome)
		e.jira.ChangeLabels(c.key, maintainer, []string{c.label}, nil)
		e.waitDeliveries()
		eventually(t, 20*time.Second, c.key+" classified", func() bool { return e.metrics.Count(202, c.outcome) > published })
		if n := reads() - before; n != c.reads {
			t.Errorf("%s: %d Jira reads before the publish, want %d\n%v", c.name, n, c.reads, e.jira.Requests()[before:])
		}
	}
	// A retry (an old payload): the issue as Jira has it now, read by the scope search alone.
	body := e.event("RHEL-5", maintainer, labels.Todo)
	body = []byte(strings.Replace(string(body), `"timestamp":`, `"timestamp":1,"x":`, 1))
	before := reads()
	if st, ans := e.post(body, signed(body, "retry-5")); st != 202 || ans["outcome"] != "published" {
		t.Fatalf("retry: %d %v\n%s", st, ans, e.logs)
	}
	if n := reads() - before; n != 2 { // the search, and the changelog: a retry's changelog may be old
		t.Errorf("retry: %d Jira reads, want 2 (search, changelog)\n%v", n, e.jira.Requests()[before:])
	}
}

// todoByMaintainer adds ymir_todo to is, an hour ago, by the maintainer (in its changelog).
func todoByMaintainer(is fakejira.Issue) fakejira.Issue {
	with := append(slices.Clone(is.Labels), labels.Todo)
	is.Changelog = append(is.Changelog, jira.ChangelogEntry{ID: "cl-todo", Author: maintainer,
		Created: jira.Time{Time: time.Now().Add(-time.Hour)},
		Items:   []jira.ChangeItem{{Field: "labels", FromString: strings.Join(is.Labels, " "), ToString: strings.Join(with, " ")}}})
	is.Labels = with
	return is
}

// A stored delivery leaves the inbox only once its classification is counted and logged,
// so an empty inbox means every delivery in it is accounted for (issue 35 item 11:
// TestLockedIssueKeepsTrigger read the count between the delete and the count). The
// count is read at the moment the receiver deletes the entry.
func TestInboxEmptiesOnceCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []fakejira.Issue{issue("RHEL-1", "ymir_triaged_rebase")}, withoutRun())
	inbox := InboxStream(e.topo)
	var deletes, countedAtDelete atomic.Int64
	e.rdb.AddHook(deleteHook{inbox: inbox, seen: func() {
		deletes.Add(1)
		countedAtDelete.Add(int64(e.metrics.Count(202, "published") + e.metrics.Count(202, "own_account")))
	}})
	e.run(t)
	e.jira.ChangeLabels("RHEL-1", maintainer, []string{labels.Todo}, nil)
	e.waitDeliveries()
	// Two deliveries (the change, and the flip by ymirflow's account): at the first
	// delete one was counted, at the second two.
	eventually(t, 20*time.Second, "both deliveries deleted", func() bool { return deletes.Load() == 2 })
	if got := countedAtDelete.Load(); got != 1+2 {
		t.Fatalf("classifications counted when their entries were deleted: %d in all, want 3\n%s", got, e.logs)
	}
}

// deleteHook calls seen before each pipeline that XDELs from inbox is sent.
type deleteHook struct {
	inbox string
	seen  func()
}

func (deleteHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (deleteHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h deleteHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if args := c.Args(); len(args) > 1 && strings.EqualFold(fmt.Sprint(args[0]), "xdel") && args[1] == h.inbox {
				h.seen()
			}
		}
		return next(ctx, cmds)
	}
}
