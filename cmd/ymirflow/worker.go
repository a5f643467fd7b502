package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/stage"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners"
	"github.com/ymirflow/ymirflow/runners/demorunner"
)

const workerHelp = `
Runs one agent's router until SIGTERM or SIGINT: it reads the agent's input streams
(and their :todo twins) through the consumer group of the agent and branch, takes
the issue's lease for each event, and runs the agent: --runner exec runs --exec with
/bin/sh -c per event (the task JSON on stdin, the result JSON on stdout; see
docs/agents.md), --runner demo simulates one. A worker per agent and
branch: triage takes no --branch, rebase, backport and rebuild one of c9s, c10s.

Each process needs its own CONSUMER_NAME: unset, it is the hostname in Kubernetes (the
pod's name) and hostname-pid elsewhere, and a worker refuses to start while a live
process has its name in the group. METRICS_ADDR defaults to a free port on loopback
(logged at start), so that workers share a machine; set it (e.g. :9090) where
something scrapes it.
`

// runWorker runs one agent's router until SIGTERM/SIGINT: `ymirflow worker --agent A
// [--branch B] [--runner exec|demo] [--exec CMD]`.
func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Worker
	var p workerPrep
	return operator{name: "worker", settings: &cfg, common: &cfg.Common,
		check: func(s *session) (err error) {
			p, err = prepareWorker(s, &cfg)
			return err
		},
		work: func(ctx context.Context, s *session) error { return serveWorker(ctx, s, &cfg, p) },
	}.run(ctx, args, stdout, stderr)
}

// workerPrep is what a worker settles before it dials Redis.
type workerPrep struct {
	agentEnv runners.AgentEnv
	token    string           // the Jira token
	red      *redact.Redactor // everything the worker writes passes it
}

// prepareWorker builds the agent's environment and the worker's redactor, and redacts
// s.stderr with it: the log, Jira comments, results and dead letters all pass it.
func prepareWorker(s *session, cfg *config.Worker) (workerPrep, error) {
	if err := noArgs("")(s); err != nil {
		return workerPrep{}, err
	}
	policy, err := cfg.AgentEnvPolicy()
	if err != nil {
		return workerPrep{}, usagef("RUNNER_ENV: %v", err)
	}
	agentEnv := runners.BuildAgentEnv(os.Environ(), policy)
	token, err := cfg.Token()
	if err != nil {
		return workerPrep{}, err
	}
	red := redact.New(append(ownSecrets(&cfg.Common, token), agentEnv.Secrets...)...)
	s.stderr = red.Writer(s.stderr)
	return workerPrep{agentEnv: agentEnv, token: token, red: red}, nil
}

// serveWorker runs the worker's router until ctx ends.
func serveWorker(ctx context.Context, s *session, cfg *config.Worker, p workerPrep) error {
	e, agentEnv, token, red := s.env, p.agentEnv, p.token, p.red
	log := e.log
	pipeline.WarnOldServer(ctx, e.rdb, log) // README, "Requirements"
	if _, err := pipeline.CheckPersistence(ctx, e.rdb, log, cfg.RequireAOF); err != nil {
		return usagef("REQUIRE_AOF (--require-aof): %v", err)
	}

	// One process per consumer name: a second one would resume the first's pending
	// entries while the first still runs them.
	group := e.topology.Group(cfg.Agent, cfg.Branch)
	claim, err := pipeline.ClaimConsumer(ctx, e.rdb, e.topology, group, cfg.ConsumerName, 0, log)
	if errors.Is(err, pipeline.ErrConsumerInUse) {
		return usagef("CONSUMER_NAME (--consumer-name) = %q is taken (%w): give each worker its own name, or leave CONSUMER_NAME unset for hostname-pid", cfg.ConsumerName, err)
	}
	if err != nil {
		return err
	}
	defer claim.Release(context.Background())

	tp, stopTracing, err := startTracing(ctx, &cfg.Tracing, "worker", log)
	if err != nil {
		return err
	}
	defer stopTracing()

	metrics := pipeline.NewMetrics(e.registry())
	locker, err := e.newLocker(lease.Options{TTL: cfg.LockTTL, MaxHold: cfg.LockMaxHold, Owner: cfg.ConsumerName,
		Observer: metrics, WaitReplicas: cfg.LockWaitReplicas, WaitAOF: cfg.LockWaitAOF})
	if err != nil {
		return usagef("%v", err)
	}
	if err := checkReplicas(ctx, locker, cfg, log); err != nil {
		return err
	}
	policies, scopes, limits, err := workerRules(cfg, locker)
	if err != nil {
		return err
	}

	shared, runLimit, err := workerLimits(e, cfg)
	if err != nil {
		return err
	}
	jc, err := workerJira(cfg, token, shared, log)
	if err != nil {
		return err
	}
	runner := workerRunner(cfg, p, log)
	ledger, control, err := controlChannel(e, cfg, locker, metrics, log)
	if err != nil {
		return err
	}
	router, err := stage.New(stage.Config{
		Router: pipeline.RouterConfig{Client: e.rdb, ClientOptions: e.opts, Topology: e.topology,
			Agent: cfg.Agent, Branch: cfg.Branch, Consumer: cfg.ConsumerName, Concurrency: cfg.Concurrency, ReadBatch: cfg.ReadBatch,
			BlockTime: cfg.BlockTime, MaxIdleTime: cfg.MaxIdleTime, ClaimInterval: cfg.ClaimInterval,
			MaxRetries: cfg.MaxRetries, CloseTimeout: cfg.ShutdownBudget(), MaxLen: cfg.MaxLen, Policies: policies, Scopes: scopes,
			MailboxDepth: cfg.MailboxDepth, Locker: locker, Logger: log, Metrics: metrics, MaxEventBytes: cfg.MaxEventBytes, Redactor: red,
			TracerProvider: tp, RunLimit: runLimit, Limits: limits,
			Pauses: locker.Pauses()},
		Handler: handlers.Config{Runner: runner, Jira: jc,
			Publisher: event.NewPublisher(e.rdb, cfg.MaxLen).WithMaxEventBytes(cfg.MaxEventBytes).WithTracerProvider(tp),
			Results:   event.NewResults(e.rdb, e.topology.Results(), cfg.MaxLen).WithRedactor(red),
			DryRun:    cfg.DryRun || jc == nil, Redactor: red, Fences: metrics, TracerProvider: tp, Ledger: ledger, Control: control},
		NoticeFailures: true,
	})
	if err != nil {
		return usagef("%v", err)
	}

	metricsAddr := "off"
	if cfg.MetricsAddr != "" {
		addr, err := pipeline.Health{Metrics: metrics, Redis: e.rdb, Ready: router.Healthy}.Serve(ctx, cfg.MetricsAddr)
		if err != nil {
			return listenError("METRICS_ADDR", "metrics-addr", cfg.MetricsAddr, err)
		}
		metricsAddr = addr.String()
	}
	var streams []string
	for _, r := range e.topology.Inputs(cfg.Agent, cfg.Branch) {
		streams = append(streams, r.Stream)
	}
	jiraDesc := "none (writes logged, not sent)"
	if cfg.JiraURL != "" {
		jiraDesc = redact.URL(cfg.JiraURL)
	}
	log.Info().Str("agent", cfg.Agent).Str("branch", cfg.Branch).Str("streams", strings.Join(streams, ",")).
		Str("group", group).Str("consumer", cfg.ConsumerName).
		Int("concurrency", cfg.Concurrency).Str("lock_ttl", cfg.LockTTL.String()).Str("heartbeat", cfg.HeartbeatInterval().String()).
		Str("lock_max_hold", cfg.LockMaxHold.String()).Str("on_conflict", policies.String()).Str("lock_scope", scopes.String()).Int("lock_wait_replicas", cfg.LockWaitReplicas).Bool("lock_wait_aof", cfg.LockWaitAOF).Int("max_retries", cfg.MaxRetries).
		Str("max_idle_time", cfg.MaxIdleTime.String()).Str("runner", cfg.Runner).Str("kill_grace", cfg.KillGrace.String()).
		Str("jira", jiraDesc).Bool("dry_run", cfg.DryRun || jc == nil).Str("metrics_addr", metricsAddr).
		Str("redis", cfg.RedactedRedisURL()).Str("namespace", cfg.Namespace).Strs("runner_env", envNames(agentEnv.Env)).
		Int("max_event_bytes", cfg.MaxEventBytes).Msg("worker starting")

	err = router.Run(ctx)
	if ctx.Err() != nil {
		log.Info().Str("agent", cfg.Agent).Msg("worker stopped by signal")
		return nil
	}
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// workerRules parses the worker's busy policies, lock scopes and run limits, and
// checks the scopes against the Locker.
func workerRules(cfg *config.Worker, locker *lease.Locker) (lockmw.Policies, lease.Scopes, lockmw.Limits, error) {
	var none lockmw.Limits
	policies, err := cfg.Policies()
	if err != nil {
		return policies, lease.Scopes{}, none, usagef("ON_CONFLICT (--on-conflict) = %q: %v", cfg.OnConflict, err)
	}
	scopes, err := cfg.Scopes()
	if err != nil {
		return policies, scopes, none, usagef("LOCK_SCOPE (--lock-scope): %v", err)
	}
	limits, err := cfg.Limits()
	if err != nil {
		return policies, scopes, limits, usagef("%v", err)
	}
	if err := locker.CheckScopes(scopes); err != nil {
		return policies, scopes, limits, usagef("LOCK_SCOPE (--lock-scope) = %q: %v", cfg.LockScope, strings.TrimPrefix(err.Error(), lease.ErrBadScope.Error()+": "))
	}
	return policies, scopes, limits, nil
}

// workerJira is the worker's Jira client, nil when JIRA_URL is unset (writes are then
// logged, not sent).
func workerJira(cfg *config.Worker, token string, shared jira.SharedLimit, log zerolog.Logger) (handlers.JiraAPI, error) {
	if cfg.JiraURL == "" {
		return nil, nil
	}
	c, err := jira.New(jira.Options{BaseURL: cfg.JiraURL, Email: cfg.JiraEmail, Token: token, API: cfg.APIFlavour(), Shared: shared,
		Timeout: cfg.JiraTimeout, MaxRetries: cfg.JiraMaxRetries, RateLimit: cfg.JiraRateLimit,
		CommentGroup: cfg.JiraCommentGroup, Logger: log, DryRun: cfg.DryRun})
	if err != nil {
		return nil, usagef("%v", cfg.ClientError(err))
	}
	return c, nil
}

// workerRunner is the runner RUNNER names: the demo's simulated agents, or the exec
// runner with the agent's environment.
func workerRunner(cfg *config.Worker, p workerPrep, log zerolog.Logger) runners.Runner {
	if cfg.Runner == "demo" {
		return demorunner.Runner{Duration: cfg.DemoDuration, Seed: cfg.DemoSeed, Followups: true}
	}
	if len(p.agentEnv.Credentials) > 0 {
		log.Warn().Strs("variables", p.agentEnv.Credentials).
			Msg("RUNNER_ENV names ymirflow's own Jira credentials: the agent gets them")
	}
	return runners.ExecRunner{Command: cfg.Exec, KillGrace: cfg.KillGrace, Env: p.agentEnv.Env, Redactor: p.red, Logger: log}
}

// checkReplicas refuses LOCK_WAIT_AOF on a server without WAITAOF and warns when fewer
// replicas are online than LOCK_WAIT_REPLICAS asks for (every acquire would then be
// refused and its event redelivered until they are back).
func checkReplicas(ctx context.Context, locker *lease.Locker, cfg *config.Worker, log zerolog.Logger) error {
	if cfg.LockWaitReplicas == 0 {
		return nil
	}
	n, err := locker.CheckReplicas(ctx, locker.LockKey(cfg.Agent, "YMIR-1"))
	if errors.Is(err, lease.ErrNoWaitAOF) {
		return usagef("LOCK_WAIT_AOF (--lock-wait-aof) is set but the server has no WAITAOF (Redis or Valkey 7.2 or later): unset it to wait with WAIT")
	}
	if err != nil {
		return fmt.Errorf("LOCK_WAIT_REPLICAS (--lock-wait-replicas): %w", err)
	}
	if n < int64(cfg.LockWaitReplicas) {
		log.Warn().Int64("replicas_online", n).Int("lock_wait_replicas", cfg.LockWaitReplicas).
			Msg("fewer replicas online than LOCK_WAIT_REPLICAS: no lease is granted until enough are back (events are redelivered, not lost)")
	}
	return nil
}

// envNames lists the names of KEY=VALUE pairs (the agent's environment, for the log).
func envNames(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		out = append(out, name)
	}
	return out
}

// workerLimits builds the worker's shared budgets: Jira requests (JIRA_RATE), shared
// with every process, and the agent's run starts (RUN_RATE, "run:<agent>"), shared with
// every worker of the agent. Either is nil when unset.
func workerLimits(e *env, cfg *config.Worker) (jira.SharedLimit, *pipeline.RunLimit, error) {
	limits := map[string]ratelimit.Rate{}
	jr, hasJira := cfg.SharedRate()
	if hasJira {
		limits[LimitJira] = jr
	}
	runName := "run:" + cfg.Agent
	rr, hasRun := cfg.RunLimit()
	if hasRun {
		limits[runName] = rr
	}
	if len(limits) == 0 {
		return nil, nil, nil
	}
	l, err := e.sharedLimiter(limits)
	if err != nil {
		return nil, nil, usagef("JIRA_RATE (--jira-rate), RUN_RATE (--run-rate): %v", err)
	}
	var shared jira.SharedLimit
	if hasJira {
		b, err := l.Budget(LimitJira)
		if err != nil {
			return nil, nil, err
		}
		shared = b
	}
	var run *pipeline.RunLimit
	if hasRun {
		run = &pipeline.RunLimit{Limiter: l, Name: runName}
	}
	e.log.Info().Str("jira_rate", jr.String()).Str("run_rate", rr.String()).Str("run_limit", runName).
		Msg("shared rate limits: Jira requests with every ymirflow process, run starts with every worker of the agent")
	return shared, run, nil
}
