package integration

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// timings are the worker settings of a scenario. The short TTLs keep recovery fast.
type timings struct {
	LockTTL, MaxIdle, Block, Claim, KillGrace time.Duration
	MaxRetries                                int
}

var shortTimings = timings{LockTTL: 2 * time.Second, MaxIdle: time.Second, Block: 200 * time.Millisecond,
	Claim: 200 * time.Millisecond, MaxRetries: 2,
	KillGrace: 200 * time.Millisecond} // at most LOCK_TTL/10, the lease's safety margin

// group is one consumer group: an agent and its branch ("" for triage).
type group struct{ agent, branch string }

func (g group) String() string {
	if g.branch == "" {
		return g.agent
	}
	return g.agent + "-" + g.branch
}

// allGroups is every consumer group of the pipeline: triage, then each downstream agent
// on each branch.
func allGroups() []group {
	gs := []group{{agent: "triage"}}
	for _, a := range event.Agents[1:] {
		for _, b := range event.Branches {
			gs = append(gs, group{a, b})
		}
	}
	return gs
}

// jiraToken is the fake Jira's bearer token.
const jiraToken = "integration-token"

// topo is the pipeline's topology: the default namespace (each scenario has its own Redis),
// so lease keys are the Python-compatible lock:<agent>:<KEY>.
var topo = event.Topology{}

// options shape a scenario.
type options struct {
	tm timings
	// triage workers, and workers per downstream (agent, branch).
	triage, perGroup int
	// runner sleep bounds (ms), and one issue made slow ("KEY:MS").
	runnerMin, runnerMax int
	slowIssue            string
	// proxy puts an in-process toxiproxy proxy between each worker and Redis.
	proxy bool
	// fetcher feeds issues with `ymirflow fetch` when the command is built; else enqueue.
	fetcher bool
	// cluster runs everything on a local 3-master Redis Cluster instead of one server.
	cluster bool
	// noFail: every downstream run succeeds (no dead letters).
	noFail bool
	// webhook runs `ymirflow webhook` too: the fake Jira sends it a signed delivery for
	// every issue it creates (addIssues), racing the fetcher's sweeps.
	webhook bool
	// workerArgs are more flags for the workers of g (--lock-scope, --on-conflict...).
	workerArgs func(g group) []string
	// runnerEnv are more variables of every runner (RUNNER_*, see ledger-runner.sh).
	runnerEnv []string
}

func defaultOptions() options {
	o := options{tm: shortTimings, triage: 2, perGroup: 1, runnerMin: 20, runnerMax: 150, fetcher: true}
	if *long {
		o.perGroup = 2
	}
	return o
}

// scenario is one test's world: a private redis-server (AOF on), an in-process fake Jira,
// the ledger, and the worker processes.
type scenario struct {
	t      *testing.T
	o      options
	dir    string
	srv    *redistest.Server // nil on a cluster
	url    string            // REDIS_URL of every process
	rdb    redis.UniversalClient
	fj     *fakejira.Server
	ledger string

	tp      *toxiproxy.ApiServer
	proxies map[string]*toxiproxy.Proxy // by worker name

	mu        sync.Mutex
	workers   map[string]*worker // current instance by name
	all       []*worker          // every instance started
	kills     map[int]time.Time  // worker pid → when the test SIGKILLed it
	issues    []string           // every issue key seeded, in order
	fetch     *exec.Cmd
	fetchMu   sync.Mutex
	fetchLg   string
	fetchDone chan struct{}
	seq       int
	hook      *exec.Cmd // `ymirflow webhook`, with webhook
	hookAddr  string
	hookLog   string
}

// worker is one `ymirflow worker` process.
type worker struct {
	name    string
	g       group
	cmd     *exec.Cmd
	pid     int
	logPath string
	metrics string
	started time.Time
	ready   time.Time
	done    chan struct{}

	mu     sync.Mutex
	exitAt time.Time
	err    error
}

func (w *worker) exited() (time.Time, error, bool) {
	select {
	case <-w.done:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.exitAt, w.err, true
	default:
		return time.Time{}, nil, false
	}
}

func (w *worker) alive() bool {
	_, _, gone := w.exited()
	return !gone
}

func newScenario(t *testing.T, o options) *scenario {
	t.Helper()
	dir := t.TempDir()
	if *keep {
		d, err := os.MkdirTemp("", "ymirflow-"+strings.ReplaceAll(t.Name(), "/", "_")+"-")
		if err != nil {
			t.Fatal(err)
		}
		dir = d
		t.Logf("scenario directory kept: %s", dir)
	}
	s := &scenario{t: t, o: o, dir: dir, ledger: filepath.Join(dir, "ledger"),
		workers: map[string]*worker{}, kills: map[int]time.Time{}, proxies: map[string]*toxiproxy.Proxy{}}
	if o.cluster {
		c := startCluster(t, 3)
		s.url, s.rdb = c.URL(), c.Client()
	} else {
		s.srv = redistest.StartServer(t, redistest.ServerOptions{AOF: true})
		s.url, s.rdb = s.srv.URL(), s.srv.Client()
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	fo := fakejira.Options{Token: jiraToken}
	if o.webhook {
		s.hookAddr = "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
		fo.Webhooks = []fakejira.WebhookTarget{{URL: "http://" + s.hookAddr + "/", Secret: hookSecret}}
	}
	s.fj = fakejira.New(fo)
	s.fj.Start()
	if o.proxy {
		s.tp = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	}
	t.Cleanup(s.close)
	return s
}

// close ends every process the scenario started, then the proxies and the fake Jira.
func (s *scenario) close() {
	s.stopFetcher()
	s.mu.Lock()
	ws := slices.Clone(s.all)
	s.mu.Unlock()
	for _, w := range ws {
		if w.alive() {
			_ = w.cmd.Process.Signal(syscall.SIGCONT)
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	}
	for _, p := range s.proxies {
		p.Stop()
	}
	s.fj.Close()
	if s.t.Failed() {
		s.dumpLogs()
	}
}

// dumpLogs prints the error lines of every worker's log (a failed scenario).
func (s *scenario) dumpLogs() {
	s.mu.Lock()
	ws := slices.Clone(s.all)
	s.mu.Unlock()
	for _, w := range ws {
		b, err := os.ReadFile(w.logPath)
		if err != nil {
			continue
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"level":"error"`) || strings.Contains(l, "panic") || strings.HasPrefix(l, "ymirflow") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 20 {
			lines = append(lines[:10], append([]string{"…"}, lines[len(lines)-10:]...)...)
		}
		if len(lines) > 0 {
			s.t.Logf("worker %s (pid %d) errors:\n%s", w.name, w.pid, strings.Join(lines, "\n"))
		}
	}
}

// ---- workers ----

// redisURLFor is the Redis URL a worker uses: through its own proxy when the scenario has
// proxies, else straight to the server.
func (s *scenario) redisURLFor(name string) string {
	if s.tp == nil {
		return s.url
	}
	p, ok := s.proxies[name]
	if !ok {
		p = toxiproxy.NewProxy(s.tp, name, "127.0.0.1:0", s.srv.Addr())
		if err := p.Start(); err != nil {
			s.t.Fatalf("proxy for %s: %v", name, err)
		}
		s.proxies[name] = p
	}
	return "redis://" + p.Listen + "/0"
}

// startWorker starts `ymirflow worker` for g as consumer name and waits until its /readyz
// answers.
func (s *scenario) startWorker(g group, name string) *worker {
	s.t.Helper()
	tm := s.o.tm
	metrics := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(s.t))
	s.mu.Lock()
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	args := []string{"worker", "--agent", g.agent}
	if g.branch != "" {
		args = append(args, "--branch", g.branch)
	}
	args = append(args,
		"--runner", "exec", "--exec", "exec "+runnerShell+" "+runnerScript, "--runner-env", "LEDGER,RUNNER_*",
		"--consumer-name", name,
		"--redis-url", s.redisURLFor(name),
		"--lock-ttl", tm.LockTTL.String(), "--max-idle-time", tm.MaxIdle.String(),
		"--block-time", tm.Block.String(), "--claim-interval", tm.Claim.String(),
		"--max-retries", strconv.Itoa(tm.MaxRetries), "--kill-grace", tm.KillGrace.String(),
		"--metrics-addr", metrics,
		"--jira-url", s.fj.URL(), "--jira-api", "server", "--jira-token", jiraToken, "--jira-rate-limit", "-1",
		"--jira-max-retries", "2", "--jira-timeout", "5s",
		"--log-level", "info")
	if s.o.workerArgs != nil {
		args = append(args, s.o.workerArgs(g)...)
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = s.baseEnv()
	cmd.Env = append(cmd.Env, "LEDGER="+s.ledger,
		"RUNNER_MIN_MS="+strconv.Itoa(s.o.runnerMin), "RUNNER_MAX_MS="+strconv.Itoa(s.o.runnerMax),
		"RUNNER_SLOW_ISSUE="+s.o.slowIssue)
	if s.o.noFail {
		cmd.Env = append(cmd.Env, "RUNNER_NO_FAIL=1")
	}
	cmd.Env = append(cmd.Env, s.o.runnerEnv...)
	w := &worker{name: name, g: g, cmd: cmd, metrics: metrics, done: make(chan struct{}),
		logPath: filepath.Join(s.dir, "logs", fmt.Sprintf("%03d-%s.log", seq, name))}
	logf, err := os.Create(w.logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	w.started = time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatalf("start worker %s: %v", name, err)
	}
	w.pid = cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		logf.Close()
		w.mu.Lock()
		w.exitAt, w.err = time.Now(), err
		w.mu.Unlock()
		close(w.done)
	}()
	s.mu.Lock()
	s.workers[name] = w
	s.all = append(s.all, w)
	s.mu.Unlock()

	deadline := time.Now().Add(20 * time.Second)
	hc := &http.Client{Timeout: 300 * time.Millisecond}
	for {
		if _, err, gone := w.exited(); gone {
			b, _ := os.ReadFile(w.logPath)
			s.t.Fatalf("worker %s exited at start (%v):\n%s", name, err, tail(string(b), 3000))
		}
		resp, err := hc.Get("http://" + metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("worker %s not ready within 20s", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.ready = time.Now()
	return w
}

// baseEnv is a minimal environment for the processes, so that no REDIS_URL, LOCK_TTL...
// of the test's own environment leaks into them.
func (s *scenario) baseEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(), "LANG=C"}
	return env
}

// workerName names the i-th worker of g: triage-a, rebase-c9s-b, ...
func workerName(g group, i int) string { return g.String() + "-" + string(rune('a'+i)) }

// startAll starts the scenario's workers: o.triage for triage, o.perGroup for every
// downstream (agent, branch).
func (s *scenario) startAll() {
	s.t.Helper()
	for _, g := range allGroups() {
		n := s.o.perGroup
		if g.agent == "triage" {
			n = s.o.triage
		}
		for i := range n {
			s.startWorker(g, workerName(g, i))
		}
	}
}

// alive returns the live workers, sorted by name.
func (s *scenario) alive() []*worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*worker
	for _, w := range s.workers {
		if w.alive() {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b *worker) int { return strings.Compare(a.name, b.name) })
	return out
}

// kill SIGKILLs w and records when, for the ledger (its open run ends there).
func (s *scenario) kill(w *worker) time.Time {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	at := time.Now()
	s.mu.Lock()
	s.kills[w.pid] = at
	s.mu.Unlock()
	<-w.done
	return at
}

// terminate SIGTERMs w and returns how long it took to exit, and its exit error.
func (s *scenario) terminate(w *worker) (time.Duration, error) {
	at := time.Now()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		s.t.Fatalf("worker %s still running 30s after SIGTERM", w.name)
	}
	exitAt, err, _ := w.exited()
	return exitAt.Sub(at), err
}

// ---- feeding ----

// fetchBuilt reports whether `ymirflow fetch` is implemented in this build (another
// engineer is finishing it); without it, issues are fed with `ymirflow enqueue`.
var fetchBuilt = sync.OnceValue(func() bool {
	out, _ := exec.Command(binary, "fetch", "--help").CombinedOutput()
	return !strings.Contains(string(out), "not implemented")
})

// addIssues seeds n fresh issues (no labels) into the fake Jira, numbered after the last
// one, and gets triage requests published for them: by the fetcher's next sweep, or with
// `ymirflow enqueue`.
func (s *scenario) addIssues(n int) []string {
	s.t.Helper()
	s.mu.Lock()
	first := len(s.issues) + 1
	var keys []string
	var seed []fakejira.Issue
	now := time.Now()
	for i := range n {
		k := fmt.Sprintf("RHEL-%d", first+i)
		keys = append(keys, k)
		seed = append(seed, fakejira.Issue{Key: k, Summary: "integration issue " + k, Status: "New",
			Updated: now, Created: now})
	}
	s.issues = append(s.issues, keys...)
	s.mu.Unlock()
	if s.o.webhook {
		for _, is := range seed {
			s.fj.CreateIssue(is, fakejira.SampleMaintainer) // and its webhook delivery
		}
	} else {
		s.fj.AddIssues(seed...)
	}
	if s.feedsWithFetcher() {
		s.startFetcher()
		return keys
	}
	s.enqueue(keys...)
	return keys
}

func (s *scenario) feedsWithFetcher() bool { return s.o.fetcher && fetchBuilt() }

// enqueue publishes triage requests with `ymirflow enqueue`, retrying the keys not yet
// published while Redis is unreachable.
func (s *scenario) enqueue(keys ...string) {
	s.t.Helper()
	s.enqueueTo(group{agent: "triage"}, keys...)
}

// enqueueTo publishes requests for g with `ymirflow enqueue --agent A [--branch B]`.
func (s *scenario) enqueueTo(g group, keys ...string) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for len(keys) > 0 {
		args := []string{"enqueue", "--agent", g.agent, "--redis-url", s.url, "--log-level", "warn"}
		if g.branch != "" {
			args = append(args, "--branch", g.branch)
		}
		args = append(args, keys...)
		cmd := exec.Command(binary, args...)
		cmd.Env = s.baseEnv()
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		published := 0
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if f := strings.Split(sc.Text(), "\t"); len(f) == 3 {
				published++
			}
		}
		keys = keys[published:]
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("enqueue failed for 60s: %v: %s", err, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startFetcher starts `ymirflow fetch --interval 300ms` once.
func (s *scenario) startFetcher() {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	if s.fetch != nil {
		return
	}
	s.fetchLg = filepath.Join(s.dir, "logs", "fetch.log")
	logf, err := os.Create(s.fetchLg)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(binary, "fetch", "--interval", "300ms", "--redis-url", s.url,
		"--jira-url", s.fj.URL(), "--jira-api", "server", "--jira-token", jiraToken, "--jira-trigger-group", "", "--jira-rate-limit", "-1",
		"--jira-jql", "project = RHEL", "--jira-max-retries", "2", "--jira-timeout", "5s", "--log-level", "info")
	cmd.Env = s.baseEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start fetcher: %v", err)
	}
	s.fetch = cmd
	s.fetchDone = make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(s.fetchDone) }()
}

// hookSecret signs the fake Jira's webhook deliveries.
const hookSecret = "integration-hook-secret"

// startWebhook starts `ymirflow webhook` on the address the fake Jira delivers to, and
// waits until it answers.
func (s *scenario) startWebhook() {
	s.t.Helper()
	secret := filepath.Join(s.dir, "hook-secret")
	if err := os.WriteFile(secret, []byte(hookSecret+"\n"), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.hookLog = filepath.Join(s.dir, "logs", "webhook.log")
	logf, err := os.Create(s.hookLog)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(binary, "webhook", "--addr", s.hookAddr, "--metrics-addr", "", "--redis-url", s.url,
		"--jira-url", s.fj.URL(), "--jira-api", "server", "--jira-token", jiraToken, "--jira-trigger-group", "",
		"--jira-rate-limit", "-1", "--jira-jql", "project = RHEL", "--webhook-secret-file", secret, "--log-level", "info")
	cmd.Env = s.baseEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start webhook: %v", err)
	}
	s.hook = cmd
	s.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.hookAddr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.hookLog)
			s.t.Fatalf("the webhook does not listen on %s:\n%s", s.hookAddr, tail(string(b), 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *scenario) stopFetcher() {
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	if s.fetch == nil {
		return
	}
	_ = s.fetch.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.fetchDone:
	case <-time.After(5 * time.Second):
		_ = s.fetch.Process.Kill()
		<-s.fetchDone
	}
}

// ---- waiting ----

// waitSettled waits until every seeded issue has a triage request, every entry of every
// input stream has its terminal outcome, and no group has a pending entry.
func (s *scenario) waitSettled(within time.Duration) time.Time {
	s.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		if s.fetchDone != nil {
			select {
			case <-s.fetchDone:
				b, _ := os.ReadFile(s.fetchLg)
				s.t.Fatalf("the fetcher exited:\n%s", tail(string(b), 2000))
			default:
			}
		}
		ok, why := s.settled()
		if ok {
			return time.Now()
		}
		last = why
		if time.Now().After(deadline) {
			s.t.Fatalf("not settled within %s: %s", within, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *scenario) settled() (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.snapshot(ctx)
	if err != nil {
		return false, err.Error()
	}
	s.mu.Lock()
	issues := slices.Clone(s.issues)
	s.mu.Unlock()
	requested := map[string]bool{}
	for _, e := range st.entries {
		if e.route.Agent == "triage" {
			requested[e.issue] = true
		}
	}
	for _, k := range issues {
		if !requested[k] {
			return false, "no triage request yet for " + k
		}
	}
	for _, e := range st.entries {
		if len(st.resultsOf[e.key()]) == 0 && len(st.deadOf[e.key()]) == 0 {
			return false, fmt.Sprintf("no outcome yet for %s %s (%s)", e.stream, e.id, e.issue)
		}
	}
	if ok, why := st.policiesSettled(); !ok {
		return false, why
	}
	for g, n := range st.pending {
		if n > 0 {
			return false, fmt.Sprintf("%d entries pending in %s", n, g)
		}
	}
	return true, ""
}

// ---- proxies ----

// toxic adds a toxic to the proxies of the named workers (every proxy when names is empty).
func (s *scenario) toxic(name, kind, stream string, attrs string, names ...string) {
	s.t.Helper()
	for n, p := range s.proxies {
		if len(names) > 0 && !slices.Contains(names, n) {
			continue
		}
		js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, kind, stream, attrs)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			s.t.Fatalf("toxic %s on %s: %v", name, n, err)
		}
	}
}

func (s *scenario) removeToxic(name string, names ...string) {
	s.t.Helper()
	for n, p := range s.proxies {
		if len(names) > 0 && !slices.Contains(names, n) {
			continue
		}
		if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
			s.t.Fatalf("remove toxic %s on %s: %v", name, n, err)
		}
	}
}

// ---- helpers ----

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// logLines returns the lines of w's log that contain every one of subs.
func logLines(w *worker, subs ...string) []string {
	b, err := os.ReadFile(w.logPath)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		match := true
		for _, sub := range subs {
			if !strings.Contains(l, sub) {
				match = false
				break
			}
		}
		if match && l != "" {
			out = append(out, l)
		}
	}
	return out
}

func randDur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rand.Int64N(int64(hi-lo)+1))
}
