package handlers_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
	"github.com/ymirflow/ymirflow/runners"
)

// env is one test's world: its own namespace on the shared test Redis, a fake Jira and
// a real Jira client talking to it.
type env struct {
	*pipelinetest.Env
	t       testing.TB
	rdb     *redis.Client
	ns      string
	topo    event.Topology
	opts    *redis.UniversalOptions
	pub     *event.Publisher
	results *event.Results
	fj      *fakejira.Server
	jc      *jira.Client
	log     zerolog.Logger
}

func newEnv(t testing.TB, issues ...fakejira.Issue) *env {
	t.Helper()
	re := pipelinetest.New(t)
	rdb, ns, topo, opts := re.Client, re.Namespace, re.Topology, re.Options
	fj := fakejira.New(fakejira.Options{Issues: issues, Token: "secret"})
	url := fj.Start()
	t.Cleanup(fj.Close)
	jc, err := jira.New(jira.Options{BaseURL: url, Token: "secret", API: jira.APIServer, MaxRetries: 2,
		RetryBaseDelay: 5 * time.Millisecond, MaxRetryDelay: 20 * time.Millisecond, RateLimit: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.Nop()
	if os.Getenv("YMIR_TEST_LOG") != "" {
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Str("test", t.Name()).Logger()
	}
	return &env{Env: re, t: t, rdb: rdb, ns: ns, topo: topo, opts: opts, pub: re.Publisher,
		results: event.NewResults(rdb, topo.Results(), 0), fj: fj, jc: jc, log: log}
}

func (e *env) locker() *lease.Locker {
	return e.Locker(lease.Options{TTL: 3 * time.Second})
}

// handler builds an agent's handler on this env.
func (e *env) handler(agent, branch string, r runners.Runner, mod ...func(*handlers.Config)) message.NoPublishHandlerFunc {
	e.t.Helper()
	cfg := handlers.Config{Agent: agent, Branch: branch, Runner: r, Jira: e.jc, Publisher: e.pub, Results: e.results,
		Topology: e.topo, MaxRetries: 3, Logger: e.log}
	for _, m := range mod {
		m(&cfg)
	}
	h, err := handlers.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// router runs a real pipeline router for (agent, branch) with fast settings.
func (e *env) router(ctx context.Context, agent, branch string, h message.NoPublishHandlerFunc, maxRetries int) *pipeline.Router {
	e.t.Helper()
	cfg := e.Config(agent, branch, "w-"+agent+branch, e.locker(), h)
	cfg.MaxRetries, cfg.Logger = maxRetries, e.log
	r, _ := e.Start(ctx, cfg)
	return r
}

// triageMsg is a triage request as the fetcher or enqueue writes it.
func triageMsg(t testing.TB, key string, userTriggered bool, extra string) *message.Message {
	t.Helper()
	payload := `{"metadata":{"issue":"` + key + `","force_cve_triage":false` + extra + `},"attempts":0,"user_triggered":` +
		strconv.FormatBool(userTriggered) + `,"origin":"test"}`
	task, err := event.ParseTask([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func downstreamMsg(t testing.TB, agent, key, branch string, userTriggered bool) *message.Message {
	t.Helper()
	task := event.Task{UserTriggered: userTriggered}
	_ = task.Set("jira_issue", key)
	_ = task.Set("target_branch", branch)
	_ = task.Set("triage_result", map[string]any{"resolution": agent, "data": map[string]any{"jira_issue": key}})
	msg, err := event.New(event.RequestedEvent(agent), key, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// attempt calls h as the pipeline's attempt n would.
func attempt(h message.NoPublishHandlerFunc, msg *message.Message, n int) error {
	msg.Metadata.Set(event.MetaAttempt, strconv.Itoa(n))
	return h(msg)
}

func (e *env) labels(key string) []string {
	l := slices.Clone(e.fj.Labels(key))
	sort.Strings(l)
	return l
}

func (e *env) wantLabels(key string, want ...string) {
	e.t.Helper()
	sort.Strings(want)
	if got := e.labels(key); !slices.Equal(got, want) {
		e.t.Fatalf("labels of %s = %v, want %v", key, got, want)
	}
}

func (e *env) entries(stream string) []redis.XMessage {
	e.t.Helper()
	all, err := e.rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return all
}

func (e *env) records(eventType string) []map[string]any {
	var out []map[string]any
	for _, m := range e.entries(e.topo.Results()) {
		if eventType == "" || m.Values["event_type"] == eventType {
			out = append(out, m.Values)
		}
	}
	return out
}

func (e *env) recordsOf(key, agent string) []map[string]any {
	var out []map[string]any
	for _, r := range e.records("") {
		if r["issue_key"] == key && r["agent"] == agent {
			out = append(out, r)
		}
	}
	return out
}

// streamsWithEntries lists every stream of the topology (and results/dead) that holds
// at least one entry.
func (e *env) streamsWithEntries() []string {
	var out []string
	for _, r := range e.topo.AllInputs() {
		if n, _ := e.rdb.XLen(context.Background(), r.Stream).Result(); n > 0 {
			out = append(out, r.Stream)
		}
	}
	return out
}

func detail(t testing.TB, rec map[string]any) map[string]any {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal([]byte(rec["detail"].(string)), &d); err != nil {
		t.Fatalf("detail %q: %v", rec["detail"], err)
	}
	return d
}

// fixed is a runner that returns the same result and counts its calls.
type fixed struct {
	mu    sync.Mutex
	res   runners.Result
	err   error
	calls int
	reqs  []runners.RunRequest
	// during runs inside the run, e.g. to inspect Jira mid-run.
	during func(ctx context.Context, req runners.RunRequest)
}

func (f *fixed) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	f.mu.Lock()
	f.calls++
	f.reqs = append(f.reqs, req)
	during := f.during
	f.mu.Unlock()
	if during != nil {
		during(ctx, req)
	}
	return f.res, f.err
}

func (f *fixed) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func triageResult(resolution, branch string) runners.Result {
	return runners.Result{Resolution: resolution, TargetBranch: branch, Data: json.RawMessage(`{"package":"pkg","fix_version":"` + branch + `"}`)}
}

func contains(s []string, v string) bool { return slices.Contains(s, v) }

func hasPrefix(s, p string) bool { return strings.HasPrefix(s, p) }
