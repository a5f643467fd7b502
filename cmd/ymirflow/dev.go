package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/pipeline"
)

const devHelp = `
Runs a whole local pipeline in this process until Ctrl-C (SIGINT or SIGTERM): the
fake Jira with sample issues (or JIRA_URL's Jira), the fetcher sweeping every
--interval, the webhook receiver (the fake Jira sends it a signed delivery on every
label change), one worker per stage and branch (triage; rebase, backport and rebuild
on c9s and c10s) with simulated agents or your own (--exec ./my-agent), and the
operator console, on an embedded Redis (miniredis, at --embedded-redis-addr) or
REDIS_URL's. Each component is the same code as its own command (fakejira, fetch,
webhook, worker, web), with its log in its own file under --log-dir.

It prints the console's URL and token, and the commands to try from another
terminal (ymirflow locks, pending, history, ... with the REDIS_URL it prints). Then
it shows what happens, read from the results and dead-letter streams (the records
ymirflow history shows): one line per outcome ("RHEL-1001 triaged → rebase c10s",
"RHEL-1001 rebase c10s done (fence 1)"; at most 4 a second, the rest counted), under
live counters per stage on a terminal, as plain lines elsewhere; at Ctrl-C, the
totals per stage and outcome and how long it ran.

A maintainer's comment made in the fake Jira during a run reaches the running agent:
unless --on-conflict (ON_CONFLICT) says otherwise, triage runs
comment.created=deliver,*=drop and the other stages drop; the simulated agents read
their mailbox and acknowledge what they read. --on-conflict, --mailbox-depth,
--lock-scope and --concurrency go to every worker, as the worker's own settings. A
comment travels on the twin stream of its run's and waits there while the
subscriptions that read it are busy: dev's workers handle 8 events at once per
stream, so that a backlog of sample issues rarely holds a comment until its run ends.

The embedded Redis holds everything in memory: it is gone after Ctrl-C; with more
than one worker per group, use a real Redis (miniredis's XCLAIM ignores min-idle).
`

// devStages are the workers of `ymirflow dev`: one per stage and branch.
var devStages = func() [][2]string {
	out := [][2]string{{"triage", ""}}
	for _, a := range event.Agents[1:] {
		for _, b := range event.Branches {
			out = append(out, [2]string{a, b})
		}
	}
	return out
}()

// devStopBudget bounds the wait for the components after Ctrl-C: a worker takes
// BLOCK_TIME (1s here) + 1s, plus KILL_GRACE when an --exec agent ignores SIGTERM.
const devStopBudget = 30 * time.Second

// runDev runs `ymirflow dev`. Each component runs as its own command would (runFakeJira,
// runWebhook, runWorker, runFetch, runWeb), in a goroutine, with the arguments that wire
// them to each other; the first to fail stops the others.
func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Dev
	fs, err := parseCmd("dev", &cfg, args, stdout)
	if err != nil {
		return err
	}
	if len(fs.Args()) > 0 {
		return usagef("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	logDir, err := devLogDir(cfg.LogDir)
	if err != nil {
		return err
	}
	redisURL, embedded, closeRedis, err := devRedis(ctx, &cfg)
	if err != nil {
		return err
	}
	defer closeRedis()
	// Addresses are resolved before anything starts: each component names the others'.
	fakeJira := cfg.JiraURL == ""
	webAddr, webhookAddr, jiraURL, err := devAddrs(&cfg)
	if err != nil {
		return err
	}
	token, secret := devRandom(), devRandom()

	common := []string{"--redis-url", redisURL, "--ymir-namespace", cfg.Namespace, "--log-level", cfg.LogLevel,
		"--log-format", cfg.LogFormat, "--max-len", strconv.FormatInt(cfg.MaxLen, 10),
		"--max-event-bytes", strconv.Itoa(cfg.MaxEventBytes)}
	jiraArgs := devJiraArgs(fs, given, jiraURL, fakeJira)

	dctx, stop := context.WithCancel(ctx)
	defer stop()
	g := &devGroup{stop: stop, logDir: logDir, namespace: cfg.Namespace}
	if fakeJira {
		g.start(dctx, "fakejira", runFakeJira, "--addr", strings.TrimPrefix(jiraURL, "http://"),
			"--issues", strconv.Itoa(cfg.Issues), "--seed", strconv.FormatInt(cfg.Seed, 10),
			"--log-level", cfg.LogLevel, "--log-format", cfg.LogFormat,
			"--webhook", "http://"+webhookAddr+"/", "--webhook-secret", secret)
		if err := waitHTTP(dctx, jiraURL+"/rest/api/2/myself", g); err != nil {
			return g.wait(dctx, err)
		}
	}
	webhookOn := fakeJira || given["webhook-secret"] || given["webhook-secret-file"] || os.Getenv("WEBHOOK_SECRET") != "" || os.Getenv("WEBHOOK_SECRET_FILE") != ""
	if webhookOn {
		wargs := append(append([]string{"--addr", webhookAddr, "--metrics-addr", ""}, common...), jiraArgs...)
		if fakeJira {
			wargs = append(wargs, "--webhook-secret", secret)
		}
		g.start(dctx, "webhook", runWebhook, wargs...)
	}
	consumers := g.startWorkers(dctx, &cfg, append(common, jiraArgs...))
	g.start(dctx, "fetch", runFetch, append(append([]string{"--interval", cfg.Interval.String()}, common...), jiraArgs...)...)
	g.start(dctx, "web", runWeb, append([]string{"--addr", webAddr, "--web-token", token}, common...)...)

	// Ready: the console answers and every worker holds its consumer name.
	if err := waitHTTP(dctx, "http://"+webAddr+"/", g); err != nil {
		return g.wait(dctx, err)
	}
	if err := waitClaims(dctx, redisURL, cfg.Namespace, consumers, g); err != nil {
		return g.wait(dctx, err)
	}
	devBanner(stdout, devInfo{redisURL: redisURL, embedded: embedded, namespace: cfg.Namespace, jiraURL: jiraURL,
		fakeJira: fakeJira, issues: cfg.Issues, webhook: webhookOn, webhookAddr: webhookAddr, interval: cfg.Interval,
		exec: cfg.Exec, demoDuration: cfg.DemoDuration, webAddr: webAddr, token: token, logDir: logDir})

	watch, err := startDevWatch(dctx, redisURL, cfg.Namespace, stdout)
	if err != nil {
		return g.wait(dctx, err)
	}
	err = g.wait(dctx, nil)
	watch.stop(context.WithoutCancel(ctx), stdout)
	if ctx.Err() != nil && err == nil {
		fmt.Fprintln(stdout, "ymirflow dev: stopped; every component shut down cleanly.")
	}
	return err
}

// devLogDir is LOG_DIR, created if need be, or a new temporary directory.
func devLogDir(dir string) (string, error) {
	if dir == "" {
		dir, err := os.MkdirTemp("", "ymirflow-dev-*")
		if err != nil {
			return "", fmt.Errorf("create the log directory: %w", err)
		}
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", usagef("LOG_DIR (--log-dir) %v", err)
	}
	return dir, nil
}

// devRedis is the URL of dev's Redis: REDIS_URL's, checked reachable, or an embedded
// one listening on a fixed address, for the commands of other terminals. closeRedis
// stops the embedded one.
func devRedis(ctx context.Context, cfg *config.Dev) (url string, embedded bool, closeRedis func(), err error) {
	if cfg.RedisURL != "" {
		// Unreachable: one line now, not one per component.
		rdb, err := pipeline.Connect(ctx, cfg.RedisURL)
		if err != nil {
			return "", false, nil, devRedisError(cfg.RedisURL, cfg.RedisAddr, err)
		}
		_ = rdb.Close()
		return cfg.RedisURL, false, func() {}, nil
	}
	m := miniredis.NewMiniRedis()
	// miniredis leaves TTLs alone unless told to: without this, a lease whose holder
	// died would never expire (see the demo package's comment).
	m.ClockTTL(true)
	if err := m.StartAddr(cfg.RedisAddr); err != nil {
		return "", false, nil, usagef("EMBEDDED_REDIS_ADDR (--embedded-redis-addr) %s: %v (set another address, or REDIS_URL for a real Redis)", cfg.RedisAddr, err)
	}
	return "redis://" + m.Addr() + "/0", true, m.Close, nil
}

// devAddrs resolves the console's and the webhook receiver's addresses and the Jira
// URL (the fake Jira's address when JIRA_URL is unset).
func devAddrs(cfg *config.Dev) (webAddr, webhookAddr, jiraURL string, err error) {
	if webAddr, err = resolveAddr(cfg.WebAddr, "WEB_ADDR", "web-addr"); err != nil {
		return "", "", "", err
	}
	if webhookAddr, err = resolveAddr(cfg.WebhookAddr, "WEBHOOK_ADDR", "webhook-addr"); err != nil {
		return "", "", "", err
	}
	if cfg.JiraURL != "" {
		return webAddr, webhookAddr, cfg.JiraURL, nil
	}
	a, err := resolveAddr(cfg.FakeJiraAddr, "FAKEJIRA_ADDR", "fakejira-addr")
	if err != nil {
		return "", "", "", err
	}
	return webAddr, webhookAddr, "http://" + a, nil
}

// devJiraArgs are the Jira arguments of every component. The fake Jira takes any token
// and has no rate limit to respect; a real one gets the settings given to dev (the rest
// each component reads from the environment).
func devJiraArgs(fs *flag.FlagSet, given map[string]bool, jiraURL string, fakeJira bool) []string {
	if fakeJira {
		return []string{"--jira-url", jiraURL, "--jira-token", "dev", "--jira-api", "server", "--jira-rate-limit", "-1",
			"--jira-trigger-group", fakejira.SampleTriggerGroup, "--jira-jql", "project = RHEL"}
	}
	args := []string{"--jira-url", jiraURL}
	for _, name := range []string{"jira-email", "jira-token", "jira-token-file", "jira-jql", "jira-trigger-group", "jira-api",
		"jira-comment-group", "jira-timeout", "jira-max-retries", "jira-rate-limit", "jira-rate", "jira-rate-burst", "dry-run"} {
		if given[name] {
			args = append(args, "--"+name+"="+fs.Lookup(name).Value.String())
		}
	}
	return args
}

// startWorkers starts one worker per stage and branch (devStages), each with rest
// after its own arguments, and returns their consumer groups.
func (g *devGroup) startWorkers(ctx context.Context, cfg *config.Dev, rest []string) []string {
	runner := []string{"--runner", "demo", "--demo-duration", cfg.DemoDuration.String(), "--demo-seed", strconv.FormatInt(cfg.Seed, 10)}
	if cfg.Exec != "" {
		runner = []string{"--runner", "exec", "--exec", cfg.Exec, "--runner-env", cfg.RunnerEnv}
	}
	var consumers []string
	for _, st := range devStages {
		group := event.Topology{}.Group(st[0], st[1])
		// A name per stage, stable across runs: on a real Redis a restarted dev resumes
		// its own pending entries; a second dev on the same namespace is refused.
		consumer := "dev-" + group
		consumers = append(consumers, group)
		wargs := []string{"--agent", st[0], "--consumer-name", consumer, "--metrics-addr", "", "--block-time", "1s",
			"--on-conflict", cfg.StageOnConflict(st[0]), "--mailbox-depth", strconv.FormatInt(cfg.MailboxDepth, 10), "--lock-scope", cfg.LockScope,
			"--concurrency", strconv.Itoa(cfg.Concurrency)}
		if st[1] != "" {
			wargs = append(wargs, "--branch", st[1])
		}
		g.start(ctx, "worker-"+group, runWorker, append(append(wargs, runner...), rest...)...)
	}
	return consumers
}

// devWatching is dev's display at work (devWatch), over its own connection.
type devWatching struct {
	watch  *devWatch
	rdb    interface{ Close() error }
	cancel context.CancelFunc
	done   chan struct{}
}

// startDevWatch starts dev's display on stdout: live counters on a terminal, plain
// lines elsewhere.
func startDevWatch(ctx context.Context, redisURL, ns string, stdout io.Writer) (*devWatching, error) {
	rdb, err := pipeline.Connect(ctx, redisURL)
	if err != nil {
		return nil, fmt.Errorf("dev's display: %w", err)
	}
	watch, err := newDevWatch(ctx, rdb, event.Topology{Namespace: ns}, stdout, demoIsTerminal(stdout))
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("dev's display: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &devWatching{watch: watch, rdb: rdb, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		watch.run(wctx)
	}()
	return w, nil
}

// stop ends the display once the components have stopped, and prints the summary.
func (w *devWatching) stop(ctx context.Context, stdout io.Writer) {
	w.cancel()
	<-w.done
	w.watch.summary(ctx, stdout)
	_ = w.rdb.Close()
}

// devGroup runs dev's components; the first that ends with an error stops the others.
type devGroup struct {
	stop      context.CancelFunc
	logDir    string
	namespace string
	wg        sync.WaitGroup
	mu        sync.Mutex
	err       error
	files     []*os.File
}

func (g *devGroup) start(ctx context.Context, name string, run func(context.Context, []string, io.Writer, io.Writer) error, args ...string) {
	f, err := os.OpenFile(filepath.Join(g.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		g.fail(fmt.Errorf("%s: log file: %w", name, err))
		return
	}
	g.mu.Lock()
	g.files = append(g.files, f)
	g.mu.Unlock()
	// One writer serialises the writes of a component's goroutines (its logger, its
	// stdout and stderr) to its log file, so that lines never interleave.
	out := zerolog.SyncWriter(f)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := run(ctx, args, out, out)
		switch {
		case errors.Is(err, pipeline.ErrConsumerInUse):
			// dev names its workers itself: the user never set CONSUMER_NAME.
			g.fail(usagef("another `ymirflow dev` runs on namespace %s of this Redis (%v): stop it, "+
				"or give this one another namespace (--ymir-namespace)", g.namespace, inUseDetail(err)))
		case err != nil:
			g.fail(fmt.Errorf("%s: %w (its log: %s)", name, err, f.Name()))
		}
	}()
}

// inUseDetail returns the part of err that says which process holds the name
// ("consumer name in use: pid N on host H ..."), without the worker's advice.
func inUseDetail(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if errors.Unwrap(e) == pipeline.ErrConsumerInUse { //nolint:errorlint // the wrapper right around the sentinel, not any in the chain
			return e
		}
	}
	return err
}

// devRedisError explains why REDIS_URL's server did not answer dev's PING. The common
// case is a terminal that still has the REDIS_URL an earlier dev printed for its
// embedded Redis, which went away with it.
func devRedisError(redisURL, embeddedAddr string, err error) error {
	if errors.Is(err, pipeline.ErrRedisUnreachable) && strings.Contains(redisURL, "://"+embeddedAddr+"/") {
		return usagef("REDIS_URL = %s is the embedded Redis of an earlier `ymirflow dev`, gone when it stopped: "+
			"unset REDIS_URL (unset REDIS_URL YMIR_NAMESPACE) to start a new embedded one, or set it to a running Redis", redact.URL(redisURL))
	}
	return fmt.Errorf("REDIS_URL (--redis-url): %w", err)
}

func (g *devGroup) fail(err error) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.stop()
}

func (g *devGroup) failed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// wait stops everything when cause is not nil, and otherwise runs until ctx (the
// group's context) ends: Ctrl-C or a component's failure. Only then does the stop
// budget start: the components get devStopBudget to end. It returns the first error.
func (g *devGroup) wait(ctx context.Context, cause error) error {
	if cause != nil {
		g.fail(cause)
	}
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		case <-time.After(devStopBudget):
			// The log files stay open: a component still running may yet write to them.
			g.fail(fmt.Errorf("components still running %s after the stop", devStopBudget))
			return g.failed()
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range g.files {
		_ = f.Close()
	}
	return g.err
}

// resolveAddr returns addr with a port of 0 replaced by a free one, so that the
// components can be told each other's addresses before they listen. An address
// something already listens on is refused, naming dev's setting (env and flagName).
func resolveAddr(addr, env, flagName string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", usagef("%s (--%s) = %q must be host:port", env, flagName, addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	// Tried here, where dev's own setting can be named: the component that fails to
	// listen later would name its own flag (web's --addr), not the one the user set.
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return "", usageError{listenError(env, flagName, addr, err)}
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String(), nil
}

// waitHTTP polls url until it answers (any status), g fails, or 30s pass.
func waitHTTP(ctx context.Context, url string, g *devGroup) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := g.failed(); err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			return nil
		}
		if ctx.Err() != nil {
			return nil // Ctrl-C while starting: a clean stop
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer after 30s", url)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitClaims polls until every worker holds its consumer name, g fails, or 30s pass.
func waitClaims(ctx context.Context, redisURL, ns string, groups []string, g *devGroup) error {
	rdb, err := pipeline.Connect(ctx, redisURL)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	topo := event.Topology{Namespace: ns}
	keys := make([]string, len(groups))
	for i, grp := range groups {
		keys[i] = topo.ConsumerClaimKey(grp, "dev-"+grp)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := g.failed(); err != nil {
			return err
		}
		if n, err := rdb.Exists(ctx, keys...).Result(); err == nil && int(n) == len(keys) {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the workers did not start within 30s")
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func devRandom() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type devInfo struct {
	redisURL, namespace, jiraURL, webhookAddr, exec, webAddr, token, logDir string
	embedded, fakeJira, webhook                                             bool
	issues                                                                  int
	interval, demoDuration                                                  time.Duration
}

// devBanner prints what runs where, and what to try from another terminal.
func devBanner(w io.Writer, d devInfo) {
	where := "Redis " + redact.URL(d.redisURL)
	if d.embedded {
		where = "the embedded Redis at " + d.redisURL
	}
	fmt.Fprintf(w, "ymirflow dev: a local pipeline on %s, namespace %s\n", where, d.namespace)
	if d.fakeJira {
		fmt.Fprintf(w, "  fake Jira   %s (%d sample issues, RHEL-1001 on; any token)\n", d.jiraURL, d.issues)
	} else {
		fmt.Fprintf(w, "  Jira        %s\n", redact.URL(d.jiraURL))
	}
	if d.webhook {
		fmt.Fprintf(w, "  webhook     http://%s/ (the fake Jira's label changes arrive here, signed)\n", d.webhookAddr)
	} else {
		fmt.Fprintln(w, "  webhook     off (set WEBHOOK_SECRET or WEBHOOK_SECRET_FILE to receive a real Jira's)")
	}
	fmt.Fprintf(w, "  fetcher     a sweep every %s\n", d.interval)
	runner := fmt.Sprintf("simulated agents, runs of about %s", d.demoDuration)
	if d.exec != "" {
		runner = "your agent: " + d.exec
	}
	fmt.Fprintf(w, "  workers     triage; rebase, backport, rebuild on c9s and c10s (%s)\n", runner)
	fmt.Fprintf(w, "  console     http://%s/ token %s\n", d.webAddr, d.token)
	fmt.Fprintf(w, "  logs        %s\n", d.logDir)
	fmt.Fprintln(w, "\nTry, from another terminal:")
	fmt.Fprintf(w, "  export REDIS_URL=%s YMIR_NAMESPACE=%s\n", redact.URL(d.redisURL), d.namespace)
	fmt.Fprintln(w, "  ymirflow locks                 # live leases")
	fmt.Fprintln(w, "  ymirflow pending               # entries in flight, and the lease guarding each")
	fmt.Fprintln(w, "  ymirflow streams               # every stream, its groups and consumers")
	fmt.Fprintln(w, "  ymirflow history RHEL-1001     # one issue's events across streams")
	fmt.Fprintln(w, "  ymirflow enqueue RHEL-1001     # triage it again, by hand")
	fmt.Fprintln(w, "  ymirflow dlq list              # what failed every retry")
	if d.fakeJira {
		fmt.Fprintf(w, "  curl -X PUT -H 'Content-Type: application/json' -H '%s: %s' \\\n", fakejira.HeaderActAs, fakejira.SampleMaintainer.AccountID)
		fmt.Fprintf(w, "    -d '{\"update\":{\"labels\":[{\"add\":\"ymir_todo\"}]}}' %s/rest/api/2/issue/RHEL-1002   # a maintainer's ymir_todo, via the webhook\n", d.jiraURL)
	}
	fmt.Fprintln(w, "\nCtrl-C stops everything.")
}
