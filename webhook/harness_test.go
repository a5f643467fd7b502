package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/metric"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const (
	secret  = "s3cret"
	group   = "Red Hat Employee"
	botID   = "ymirflow-bot"
	jqlTest = "project = RHEL"
)

var (
	maintainer = jira.User{AccountID: "maint", Name: "maint"}
	outsider   = jira.User{AccountID: "outsider", Name: "outsider"}
)

// env is a fake Jira sending webhooks to a real receiver (httptest server) on a real Redis.
type env struct {
	t       testing.TB
	ctx     context.Context
	rdb     redis.UniversalClient
	topo    event.Topology
	locker  *lease.Locker
	jira    *fakejira.Server
	jc      *jira.Client
	fetcher *fetcher.Fetcher
	rcv     *Receiver
	metrics *Metrics
	url     string
	logs    *testlog.Buffer

	mu        sync.Mutex
	processed map[string]result // by inbox id, the last classification
}

type envOpt func(*envConfig)

type envConfig struct {
	rdb     redis.UniversalClient
	ns      string
	fake    fakejira.Options
	webhook func(*Config)
	noRun   bool
	jira    func(*jira.Options)
}

func withRedis(rdb redis.UniversalClient, ns string) envOpt {
	return func(c *envConfig) { c.rdb, c.ns = rdb, ns }
}

func withFake(fn func(*fakejira.Options)) envOpt { return func(c *envConfig) { fn(&c.fake) } }

func withConfig(fn func(*Config)) envOpt { return func(c *envConfig) { c.webhook = fn } }

// withJira changes the options of the env's Jira client (the fetcher's and the
// receiver's): by default no rate limit and fast retries.
func withJira(fn func(*jira.Options)) envOpt { return func(c *envConfig) { c.jira = fn } }

// withoutRun: nothing classifies the inbox until the test calls run.
func withoutRun() envOpt { return func(c *envConfig) { c.noRun = true } }

func issue(key string, labels ...string) fakejira.Issue {
	return fakejira.Issue{Key: key, Labels: labels, Updated: time.Now().UTC().Add(-time.Minute), Components: []string{"openssl"}}
}

func newEnv(t testing.TB, issues []fakejira.Issue, opts ...envOpt) *env {
	t.Helper()
	var c envConfig
	c.fake = fakejira.Options{
		Issues:      issues,
		CurrentUser: jira.User{AccountID: botID, Name: botID},
		Groups:      map[string][]string{maintainer.AccountID: {group}, outsider.AccountID: {"jira-users"}},
	}
	for _, o := range opts {
		o(&c)
	}
	if c.rdb == nil {
		c.rdb, c.ns = redistest.Client(t)
	}
	e := &env{t: t, ctx: context.Background(), rdb: c.rdb, topo: event.Topology{Namespace: strings.TrimSuffix(c.ns, ":")},
		logs: &testlog.Buffer{}}
	// The receiver's URL must be known before the fake is built: serve through a swappable handler.
	var h http.Handler
	var hmu sync.Mutex
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hmu.Lock()
		hh := h
		hmu.Unlock()
		hh.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e.url = ts.URL
	if c.fake.Webhooks == nil {
		c.fake.Webhooks = []fakejira.WebhookTarget{{URL: ts.URL, Secret: secret}}
	}
	e.jira = fakejira.New(c.fake)
	jurl := e.jira.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.jira.WaitWebhooks(ctx)
		e.jira.Close()
	})
	var err error
	jo := jira.Options{BaseURL: jurl, Token: "t", RateLimit: -1, MaxRetries: 1,
		RetryBaseDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond, Timeout: 5 * time.Second}
	if c.jira != nil {
		c.jira(&jo)
	}
	e.jc, err = jira.New(jo)
	if err != nil {
		t.Fatal(err)
	}
	e.locker, err = lease.New(e.rdb, lease.Options{Scope: e.topo.LockScope(), Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(e.logs).Level(zerolog.DebugLevel)
	e.fetcher, err = fetcher.New(fetcher.Config{Jira: e.jc, Redis: e.rdb, Topology: e.topo, Locker: e.locker,
		JQL: jqlTest, TriggerGroup: group, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e.metrics = NewMetrics(metric.NewRegistry())
	cfg := Config{Fetcher: e.fetcher, Jira: e.jc, Redis: e.rdb, Topology: e.topo, Secret: []byte(secret),
		OwnAccounts: []string{botID}, JQL: jqlTest, Metrics: e.metrics, Logger: log,
		Deadline: 5 * time.Second} // a busy CI machine; the default is 900ms
	if c.webhook != nil {
		c.webhook(&cfg)
	}
	e.rcv, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.processed = map[string]result{}
	e.rcv.processed = func(id string, res result) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.processed[id] = res
	}
	if !c.noRun {
		e.run(t)
	}
	hmu.Lock()
	h = e.rcv
	hmu.Unlock()
	return e
}

// run classifies the env's inbox until the test ends.
func (e *env) run(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.rcv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// post sends body to the receiver with headers and returns the status and the answer;
// for a delivery stored in the inbox, once it is classified, the status and outcome of
// the classification (what the receiver answered before the inbox).
func (e *env) post(body []byte, header map[string]string) (int, map[string]string) {
	e.t.Helper()
	st, ans := e.postRaw(body, header)
	if st != http.StatusAccepted || ans["outcome"] != "queued" {
		return st, ans
	}
	var res result
	eventually(e.t, 30*time.Second, "delivery "+ans["inbox_id"]+" classified", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		var ok bool
		res, ok = e.processed[ans["inbox_id"]]
		return ok
	})
	return res.status, map[string]string{"outcome": res.outcome, "detail": res.detail, "issue_key": res.issue,
		"entry_id": res.entryID, "stream": res.stream, "inbox_id": ans["inbox_id"]}
}

// postRaw sends body to the receiver with headers, and returns the status and the answer.
func (e *env) postRaw(body []byte, header map[string]string) (int, map[string]string) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]string
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

// signed is the header set of a signed delivery.
func signed(body []byte, delivery string) map[string]string {
	return map[string]string{HeaderSignature: Sign([]byte(secret), body), HeaderDelivery: delivery}
}

// event builds a jira:issue_updated payload for key with the issue as the fake has it now,
// the change made by user adding labels.
func (e *env) event(key string, by jira.User, added ...string) []byte {
	e.t.Helper()
	is, err := e.jc.GetIssue(e.ctx, key, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(is.Raw, &raw)
	items := []map[string]any{}
	if len(added) > 0 {
		without := slices.DeleteFunc(slices.Clone(is.Fields.Labels), func(l string) bool { return slices.Contains(added, l) })
		items = append(items, map[string]any{"field": "labels", "fieldtype": "jira",
			"fromString": strings.Join(without, " "), "toString": strings.Join(is.Fields.Labels, " ")})
	}
	b, _ := json.Marshal(map[string]any{"timestamp": time.Now().UnixMilli(), "webhookEvent": EventIssueUpdated,
		"user": by, "issue": raw, "changelog": map[string]any{"id": "1", "items": items}})
	return b
}

// entries returns "KEY@triage" / "KEY@todo" for every entry of the triage streams.
func (e *env) entries() []string {
	e.t.Helper()
	var out []string
	for _, todo := range []bool{false, true} {
		s := e.topo.Stream("triage", "", todo)
		xs, err := e.rdb.XRange(e.ctx, s, "-", "+").Result()
		if err != nil {
			e.t.Fatal(err)
		}
		where := "triage"
		if todo {
			where = "todo"
		}
		for _, x := range xs {
			msg := event.DecodeEntry(s, x.ID, x.Values)
			out = append(out, msg.Metadata.Get(event.MetaIssueKey)+"@"+where)
		}
	}
	slices.Sort(out)
	return out
}

func (e *env) labels(key string) []string {
	l := slices.Clone(e.jira.Labels(key))
	slices.Sort(l)
	return l
}

// waitDeliveries waits for every webhook the fake queued so far.
func (e *env) waitDeliveries() []fakejira.Delivery {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := e.jira.WaitWebhooks(ctx); err != nil {
		e.t.Fatalf("webhooks not delivered: %v", err)
	}
	e.drain(30 * time.Second)
	return e.jira.Deliveries()
}

// drain waits until every delivery stored in the inbox is classified (classified entries
// are deleted).
func (e *env) drain(within time.Duration) {
	e.t.Helper()
	eventually(e.t, within, "inbox drained", func() bool {
		return e.rdb.XLen(e.ctx, InboxStream(e.topo)).Val() == 0
	})
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
