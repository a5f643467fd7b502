package fetcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const (
	member   = "rh-member"
	outsider = "outsider"
	group    = "Red Hat Employee"
)

// harness is a fake Jira behind a recording proxy, a real Redis namespace, and a Fetcher.
type harness struct {
	t      testing.TB
	ctx    context.Context
	rdb    redis.UniversalClient
	ns     string
	topo   event.Topology
	locker *lease.Locker
	srv    *fakejira.Server
	url    string
	jc     *jira.Client
	cfg    Config
	now    time.Time
	logBuf *testlog.Buffer

	mu       sync.Mutex
	bodies   []recorded     // every request with its body
	failPut  map[string]int // issue key → status its label writes get
	failPath map[string]int // path prefix → status (e.g. the changelog)
	jiraOpts func(*jira.Options)
	// onRequest, when set, sees every request before it is answered.
	onRequest func(*http.Request)
}

type recorded struct {
	Method, Path, Query string
	Body                []byte
	At                  time.Time
}

type harnessOpt func(*harness, *fakejira.Options)

// withAPI picks the Jira flavour of the client (cloud: /rest/api/3/search/jql).
func withAPI(api string) harnessOpt {
	return func(h *harness, _ *fakejira.Options) {
		prev := h.jiraOpts
		h.jiraOpts = func(o *jira.Options) {
			if prev != nil {
				prev(o)
			}
			o.API = api
		}
	}
}

func withJira(fn func(*jira.Options)) harnessOpt {
	return func(h *harness, _ *fakejira.Options) {
		prev := h.jiraOpts
		h.jiraOpts = func(o *jira.Options) {
			if prev != nil {
				prev(o)
			}
			fn(o)
		}
	}
}

func withFake(fn func(*fakejira.Options)) harnessOpt {
	return func(_ *harness, o *fakejira.Options) { fn(o) }
}

func withRedis(rdb redis.UniversalClient) harnessOpt {
	return func(h *harness, _ *fakejira.Options) { h.rdb = rdb }
}

func newHarness(t testing.TB, issues []fakejira.Issue, opts ...harnessOpt) *harness {
	t.Helper()
	rdb, ns := redistest.Client(t)
	h := &harness{t: t, ctx: context.Background(), rdb: rdb, ns: ns, now: time.Now().UTC().Truncate(time.Millisecond),
		failPut: map[string]int{}, failPath: map[string]int{}, logBuf: &testlog.Buffer{}}
	fo := fakejira.Options{
		Issues: issues,
		Groups: map[string][]string{member: {group, "jira-users"}, outsider: {"jira-users"}},
		Clock:  func() time.Time { return h.now },
	}
	for _, o := range opts {
		o(h, &fo)
	}
	h.topo = event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	h.srv = fakejira.New(fo)
	ts := httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(ts.Close)
	h.url = ts.URL
	jo := jira.Options{BaseURL: h.url, Token: "t", RateLimit: -1, MaxRetries: 2, RetryBaseDelay: time.Millisecond,
		MaxRetryDelay: 5 * time.Millisecond, Timeout: 10 * time.Second}
	if h.jiraOpts != nil {
		h.jiraOpts(&jo)
	}
	jc, err := jira.New(jo)
	if err != nil {
		t.Fatal(err)
	}
	h.jc = jc
	h.locker, err = lease.New(h.rdb, lease.Options{Scope: h.topo.LockScope(), Owner: "test"})
	if err != nil {
		t.Fatal(err)
	}
	h.cfg = Config{
		Jira: jc, Redis: h.rdb, Topology: h.topo, Locker: h.locker, JQL: "project = RHEL",
		TriggerGroup: group, Clock: func() time.Time { return h.now },
		Logger: zerolog.New(h.logBuf).Level(zerolog.DebugLevel),
	}
	return h
}

// serve records the request and hands it to the fake, unless a failure is set for it.
func (h *harness) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	h.mu.Lock()
	h.bodies = append(h.bodies, recorded{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: body, At: time.Now()})
	status := 0
	if r.Method == http.MethodPut {
		for k, st := range h.failPut {
			if strings.HasSuffix(r.URL.Path, "/issue/"+k) {
				status = st
			}
		}
	}
	for p, st := range h.failPath {
		if strings.Contains(r.URL.Path, p) {
			status = st
		}
	}
	hook := h.onRequest
	h.mu.Unlock()
	if hook != nil {
		hook(r)
	}
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"errorMessages":["injected"],"errors":{}}`))
		return
	}
	h.srv.ServeHTTP(w, r)
}

func (h *harness) requests(method, pathPart string) []recorded {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []recorded
	for _, r := range h.bodies {
		if (method == "" || r.Method == method) && strings.Contains(r.Path, pathPart) {
			out = append(out, r)
		}
	}
	return out
}

// changelogReads are the requests that read an issue's changelog (key "" for any issue):
// GET …/issue/KEY/changelog (Cloud) or GET …/issue/KEY?expand=changelog (Server/DC).
func (h *harness) changelogReads(key string) []recorded {
	var out []recorded
	for _, r := range h.requests(http.MethodGet, "/issue/"+key) {
		if strings.HasSuffix(r.Path, "/changelog") || strings.Contains(r.Query, "expand=changelog") {
			out = append(out, r)
		}
	}
	return out
}

func (h *harness) fetcher(mod ...func(*Config)) *Fetcher {
	h.t.Helper()
	cfg := h.cfg
	for _, m := range mod {
		m(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return f
}

func (h *harness) sweep(mod ...func(*Config)) Summary {
	h.t.Helper()
	s, err := h.fetcher(mod...).Sweep(h.ctx)
	if err != nil {
		h.t.Fatalf("sweep: %v\nlog:\n%s", err, h.logBuf)
	}
	return s
}

// queued is one triage request found in a stream.
type queued struct {
	Stream, ID, Key string
	UserTriggered   bool
	Task            event.Task
	Meta            map[string]string
	Payload         string
}

// streamEntries returns every entry of the triage streams (:todo first).
func (h *harness) streamEntries() []queued {
	h.t.Helper()
	var out []queued
	for _, todo := range []bool{true, false} {
		s := h.topo.Stream("triage", "", todo)
		xs, err := h.rdb.XRange(h.ctx, s, "-", "+").Result()
		if err != nil {
			h.t.Fatal(err)
		}
		for _, x := range xs {
			msg := event.DecodeEntry(s, x.ID, x.Values)
			task, err := event.ParseTask(msg.Payload)
			if err != nil {
				h.t.Fatalf("entry %s: %v", x.ID, err)
			}
			meta := map[string]string{}
			for k, v := range msg.Metadata {
				meta[k] = v
			}
			out = append(out, queued{Stream: s, ID: x.ID, Key: msg.Metadata.Get(event.MetaIssueKey),
				UserTriggered: task.UserTriggered, Task: task, Meta: meta, Payload: string(msg.Payload)})
		}
	}
	return out
}

// published returns "KEY@stream-suffix" for every entry, sorted: "A-1@triage", "B-2@todo".
func (h *harness) published() []string {
	var out []string
	for _, q := range h.streamEntries() {
		where := "triage"
		if strings.HasSuffix(q.Stream, ":todo") {
			where = "todo"
		}
		out = append(out, q.Key+"@"+where)
	}
	slices.Sort(out)
	return out
}

func (h *harness) labels(key string) []string {
	l := h.srv.Labels(key)
	out := slices.Clone(l)
	slices.Sort(out)
	return out
}

// writes returns the label writes Jira received for key, as "+add -remove" strings.
func (h *harness) writes(key string) []string {
	var out []string
	for _, w := range h.srv.Writes() {
		if w.Key != key || w.Comment != "" {
			continue
		}
		var parts []string
		for _, a := range w.Add {
			parts = append(parts, "+"+a)
		}
		for _, r := range w.Remove {
			parts = append(parts, "-"+r)
		}
		out = append(out, strings.Join(parts, " "))
	}
	return out
}

// consume reads every waiting triage entry as the triage group and acks it, as a worker
// that finished them would.
func (h *harness) consume() {
	h.t.Helper()
	for _, todo := range []bool{true, false} {
		s := h.topo.Stream("triage", "", todo)
		if err := h.rdb.XGroupCreateMkStream(h.ctx, s, "triage", "0").Err(); err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			h.t.Fatal(err)
		}
		res, err := h.rdb.XReadGroup(h.ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "c1", Streams: []string{s, ">"}, Count: 1000, Block: -1}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			h.t.Fatal(err)
		}
		for _, st := range res {
			for _, m := range st.Messages {
				h.rdb.XAck(h.ctx, s, "triage", m.ID)
			}
		}
	}
}

// deliver reads every waiting triage entry as the triage group without acking it (a
// worker is on it).
func (h *harness) deliver() {
	h.t.Helper()
	for _, todo := range []bool{true, false} {
		s := h.topo.Stream("triage", "", todo)
		if err := h.rdb.XGroupCreateMkStream(h.ctx, s, "triage", "0").Err(); err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			h.t.Fatal(err)
		}
		if _, err := h.rdb.XReadGroup(h.ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "c1", Streams: []string{s, ">"}, Count: 1000, Block: -1}).Result(); err != nil && !errors.Is(err, redis.Nil) {
			h.t.Fatal(err)
		}
	}
}

// issue builders

func iss(key string, labels ...string) fakejira.Issue {
	return fakejira.Issue{Key: key, Labels: labels, Updated: time.Now().UTC().Add(-time.Minute), Components: []string{"openssl"}}
}

func updated(is fakejira.Issue, ago time.Duration) fakejira.Issue {
	is.Updated = time.Now().UTC().Add(-ago)
	return is
}

func component(is fakejira.Issue, c any) fakejira.Issue {
	if is.Fields == nil {
		is.Fields = map[string]any{}
	}
	is.Fields[DefaultComponentField] = c
	return is
}

// todoBy adds ymir_todo to is, added by each user in turn (removed in between), so the
// last user is the newest adder.
func todoBy(is fakejira.Issue, users ...string) fakejira.Issue {
	at := time.Now().UTC().Add(-time.Hour)
	entry := func(u string, from, to []string) {
		is.Changelog = append(is.Changelog, jira.ChangelogEntry{ID: "cl-" + strconv.Itoa(len(is.Changelog)),
			Author:  jira.User{AccountID: u, Name: u},
			Created: jira.Time{Time: at.Add(time.Duration(len(is.Changelog)) * time.Minute)},
			Items:   []jira.ChangeItem{{Field: "labels", FromString: strings.Join(from, " "), ToString: strings.Join(to, " ")}}})
	}
	for _, u := range users {
		if slices.Contains(is.Labels, labels.Todo) {
			without := slices.DeleteFunc(slices.Clone(is.Labels), func(l string) bool { return l == labels.Todo })
			entry(u, is.Labels, without)
			is.Labels = without
		}
		with := append(slices.Clone(is.Labels), labels.Todo)
		entry(u, is.Labels, with)
		is.Labels = with
	}
	return is
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
