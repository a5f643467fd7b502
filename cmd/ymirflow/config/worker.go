package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners"
)

// Defaults of `ymirflow worker`; the lease's, the router's and the runner's own are
// referenced, not re-declared.
const (
	DefaultRunner        = "exec"
	DefaultLockTTL       = lease.DefaultTTL
	DefaultLockMaxHold   = lease.DefaultMaxHold
	DefaultOnConflict    = string(lockmw.Drop)
	DefaultLockScope     = string(lease.ScopeAgent)
	DefaultBlockTime     = pipeline.DefaultBlockTime
	DefaultMaxIdleTime   = pipeline.DefaultMaxIdleTime
	DefaultClaimInterval = pipeline.DefaultClaimInterval
	DefaultMaxRetries    = pipeline.DefaultMaxRetries
	DefaultConcurrency   = 1
	DefaultReadBatch     = pipeline.DefaultReadBatch
	DefaultKillGrace     = runners.DefaultKillGrace
	DefaultMailboxDepth  = lease.DefaultMailboxDepth
)

// DefaultConsumerName is a worker's consumer name when CONSUMER_NAME is unset: in
// Kubernetes (KUBERNETES_SERVICE_HOST set) the hostname, which is the pod's name: unique
// per pod and stable across a container's restarts, so a restarted worker resumes its
// own pending entries at once. Elsewhere hostname-pid: two workers on one machine must
// not become one consumer (the second would resume the first's entries while the first
// runs them), and a hostname there names the machine, not the process. "" when the
// hostname cannot be read.
func DefaultConsumerName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return ""
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return h
	}
	return h + "-" + strconv.Itoa(os.Getpid())
}

// Worker is the settings of `ymirflow worker`: one agent's router.
type Worker struct {
	Common
	Jira
	Tracing

	Agent            string        // --agent, AGENT: triage|rebase|backport|rebuild
	Branch           string        // --branch, BRANCH: c9s|c10s; required for every agent but triage
	Runner           string        // --runner, RUNNER: exec|demo
	Exec             string        // --exec, RUNNER_EXEC: command run with /bin/sh -c per event (runner exec)
	RunnerEnv        string        // --runner-env, RUNNER_ENV: variables passed to the runner besides the base (NAME,PREFIX_*)
	LockTTL          time.Duration // --lock-ttl, LOCK_TTL: lease TTL; the heartbeat runs every LOCK_TTL/3
	LockMaxHold      time.Duration // --lock-max-hold, LOCK_MAX_HOLD: a lease is given up after this long
	OnConflict       string        // --on-conflict, ON_CONFLICT: busy policy table, e.g. triage.requested=drop,*=delay:2m
	MailboxDepth     int64         // --mailbox-depth, MAILBOX_DEPTH: follow-ups a lease's mailbox holds (deliver)
	LockScope        string        // --lock-scope, LOCK_SCOPE: agent|issue|group:<paths>, comma-separated
	LockWaitReplicas int           // --lock-wait-replicas, LOCK_WAIT_REPLICAS: replicas that must acknowledge each acquire and extend (0: none)
	LockWaitAOF      bool          // --lock-wait-aof, LOCK_WAIT_AOF: WAITAOF instead of WAIT (Redis 7.2+, replicas with appendonly)
	RequireAOF       bool          // --require-aof, REQUIRE_AOF: refuse to start unless Redis keeps an append-only file
	BlockTime        time.Duration // --block-time, BLOCK_TIME: XREADGROUP BLOCK
	MaxIdleTime      time.Duration // --max-idle-time, MAX_IDLE_TIME: pending entries idle this long are claimed
	ClaimInterval    time.Duration // --claim-interval, CLAIM_INTERVAL: how often pending entries are checked
	MaxRetries       int           // --max-retries, MAX_RETRIES: attempts at a failing event before the DLQ
	Concurrency      int           // --concurrency, CONCURRENCY: subscriptions per input stream
	ReadBatch        int           // --read-batch, READ_BATCH: most entries one stream read takes while the worker keeps up
	ConsumerName     string        // --consumer-name, CONSUMER_NAME: one per process (default: DefaultConsumerName)
	MetricsAddr      string        // --metrics-addr, METRICS_ADDR: /metrics, /healthz, /readyz (empty: off)
	KillGrace        time.Duration // --kill-grace, KILL_GRACE: runner SIGTERM → SIGKILL grace
	DemoDuration     time.Duration // --demo-duration, DEMO_DURATION: typical length of a simulated run (runner demo)
	DemoSeed         int64         // --demo-seed, DEMO_SEED: seed of the simulated outcomes (runner demo)
	RunRate          string        // --run-rate, RUN_RATE: run starts of this agent per period, shared by all its workers, e.g. 30/h (empty: none)
	RunRateBurst     int           // --run-rate-burst, RUN_RATE_BURST: run starts RUN_RATE lets go at once after a quiet spell
	RunLimits        string        // --run-limits, RUN_LIMITS: runs at once per agent and per field value, and the fair order of the waiting, e.g. rebase=4,field:metadata.component=1,fair:metadata.component,weight:KERNEL=3 (empty: none)
	BudgetIssueUSD   float64       // --budget-issue-usd, BUDGET_ISSUE_USD: spend limit of one issue, every agent and run (0: off)
	BudgetAgentUSD   float64       // --budget-agent-usd, BUDGET_AGENT_USD: spend limit of one agent on one issue (0: off)
	Permits          string        // --permits, PERMITS: upstream rate limits shared by every pod, e.g. llm:claude=5/s,jira=10/s
	ProgressTimeout  time.Duration // --progress-timeout, PROGRESS_TIMEOUT: a run whose agent reports no progress that long loses its lease (0: off)

	fs *flag.FlagSet // set by Register: tells which settings were given (derive)
}

// Register defines the worker's flags on fs.
func (w *Worker) Register(fs *flag.FlagSet) {
	w.Common.Register(fs)
	w.Jira.Register(fs)
	w.Tracing.register(fs)
	fs.StringVar(&w.Agent, "agent", "", "agent to run: "+strings.Join(Agents, "|"))
	fs.StringVar(&w.Branch, "branch", "", "target branch: "+strings.Join(Branches, "|")+" (every agent but triage)")
	fs.StringVar(&w.Runner, "runner", DefaultRunner, "runner: exec (a command per event) or demo (simulated agents)")
	stringVarEnv(fs, &w.Exec, "exec", "RUNNER_EXEC", "", "command run with /bin/sh -c per event by the exec runner")
	required(fs, "agent", "")
	required(fs, "branch", "required for every agent but triage")
	required(fs, "exec", "required with --runner exec")
	fs.StringVar(&w.RunnerEnv, "runner-env", "", "comma-separated variables of the worker's environment passed to the exec runner, besides PATH, HOME, LANG, TZ, TMPDIR and the YMIR_* it sets: names and PREFIX_* globs (GITLAB_TOKEN,ANTHROPIC_*). REDIS_URL is never passed; JIRA_TOKEN, JIRA_TOKEN_FILE and JIRA_EMAIL only when named")
	fs.DurationVar(&w.LockTTL, "lock-ttl", DefaultLockTTL, "TTL of the per-issue lease; the heartbeat extends it every LOCK_TTL/3"+
		rangeHelp("lock-ttl")+"; unset: "+fmtDur(DefaultLockTTL)+", raised to 10×KILL_GRACE, lowered to LOCK_MAX_HOLD and to 2×MAX_IDLE_TIME when those are set")
	fs.DurationVar(&w.LockMaxHold, "lock-max-hold", DefaultLockMaxHold, "longest a handler may hold a lease, at least LOCK_TTL"+
		rangeHelp("lock-max-hold")+"; unset: the larger of "+fmtDur(DefaultLockMaxHold)+" and LOCK_TTL")
	fs.StringVar(&w.OnConflict, "on-conflict", DefaultOnConflict, "what happens to an event whose issue is locked by another holder, per event type: "+
		"comma-separated <event type>=<policy> and *=<policy> (every other type; a bare policy is the default); the event types are "+
		strings.Join(event.WorkTypes(), ", ")+", any other is refused; e.g. triage.requested=drop,rebase.requested=coalesce,*=delay:2m. "+
		"Policies: drop (acked, recorded as lock.dropped), coalesce (kept as the issue's one queued follow-up, published at the release), "+
		"deliver (a follow-up of the run: appended to its lease's mailbox, fed to its agent as YMIR_MAILBOX; those it does not acknowledge start one next run; recorded as lock.delivered; "+
		"a maintainer's Jira comment reaches a run as the event type comment.created, published by ymirflow webhook: comment.created=deliver,*=drop delivers comments only), "+
		"delay:D[:MAX] (acked and re-queued to run after D plus up to 20% jitter, doubling per delay of the same event up to MAX, by default 8×D; "+
		"kept in Redis, so a restart loses nothing; recorded as lock.delayed with delayed_until), "+
		"supersede (the newer event replaces the running one, in any worker process: it takes the lease over with a higher fence, so the old run's writes are refused at once, "+
		"the old run is cancelled within a second (at worst one heartbeat, LOCK_TTL/3), its agent gets SIGTERM then SIGKILL after KILL_GRACE, "+
		"its event is recorded as lock.superseded naming the newer entry and acked, and the newer event runs once the old run has stopped, "+
		"or after the old lease's TTL if its worker died; an event older than the running one is recorded as lock.superseded instead), "+
		"wait[:MAX] (joins the key's line, FIFO, in the script that finds the key busy, acked, recorded as lock.waited with its position; the release hands the key "+
		"to the head of the line and appends its copy, which runs next: one at a time, in stream order, nothing lost or run twice across worker crashes; "+
		"a run that did not finish keeps its turn for its redelivery; beyond MAX waiting (default 100) the event is dead-lettered with the reason; "+
		"with LOCK_SCOPE issue or group the line is the shared key's, whatever agent or issue holds it (not both scopes at once); "+
		"combines with drop and delay only)")
	fs.Int64Var(&w.MailboxDepth, "mailbox-depth", DefaultMailboxDepth, "most follow-ups waiting in one lease's mailbox (ON_CONFLICT deliver); one more is dead-lettered with the reason. 1 to 100000")
	fs.StringVar(&w.LockScope, "lock-scope", DefaultLockScope, "what a run's lease guards, comma-separated: agent (this agent on the issue: lock:<agent>:<ISSUE>, always held), "+
		"issue (the issue across every agent that sets it: a rebase and a backport of one issue never run at once), "+
		"group:<path>[+<path>...] (a key from the event: dotted field paths of the task JSON, or m:<name> for metadata, e.g. group:metadata.component+metadata.target_branch or group:m:lock_key; "+
		"every event with the same values runs one at a time). All keys are taken at once or none; with issue or group, ON_CONFLICT=coalesce, deliver and supersede are refused, wait keeps its line on the shared key "+
		"(with one of them only), and on Redis Cluster at most one of them")
	fs.IntVar(&w.LockWaitReplicas, "lock-wait-replicas", 0, "replicas that must acknowledge each lease acquire and extend (Redis WAIT, sent after it on the same connection; on Redis Cluster to the primary of the lease's slot) before the handler starts; "+
		"an acquire not acknowledged within min(1s, LOCK_TTL/10) is given back and its event redelivered, an extend not acknowledged does not count (the lease ends unproven when none is for LOCK_TTL - LOCK_TTL/10). "+
		"Narrows what a failover can lose (see docs/architecture.md, Failover). 0 to 16; 0: no waiting (replication is asynchronous)")
	fs.BoolVar(&w.LockWaitAOF, "lock-wait-aof", false, "with LOCK_WAIT_REPLICAS: WAITAOF 0 N instead of WAIT N, so each acknowledgement means the lease is in the replica's append-only file "+
		"(Redis/Valkey 7.2 or later; replicas need appendonly yes). A server without WAITAOF is refused at start")
	fs.BoolVar(&w.RequireAOF, "require-aof", false, "refuse to start unless Redis keeps an append-only file (appendonly yes; INFO must be allowed to the worker's Redis user): "+
		"fences are counters in Redis, and a restart that loses writes hands the same fences out again. Unset: a warning at start when it keeps none")
	fs.DurationVar(&w.BlockTime, "block-time", DefaultBlockTime, "how long one stream read blocks"+rangeHelp("block-time"))
	fs.DurationVar(&w.MaxIdleTime, "max-idle-time", DefaultMaxIdleTime, "pending entries idle longer than this are claimed from their consumer; must exceed LOCK_TTL/3"+
		rangeHelp("max-idle-time")+"; unset: the larger of "+fmtDur(DefaultMaxIdleTime)+" and LOCK_TTL/2")
	fs.DurationVar(&w.ClaimInterval, "claim-interval", DefaultClaimInterval, "how often pending entries are checked for claiming"+rangeHelp("claim-interval"))
	fs.IntVar(&w.MaxRetries, "max-retries", DefaultMaxRetries, "attempts at a failing event before it goes to the dead-letter stream")
	fs.IntVar(&w.Concurrency, "concurrency", DefaultConcurrency, "events handled at once per input stream")
	fs.IntVar(&w.ReadBatch, "read-batch", DefaultReadBatch, fmt.Sprintf("most entries one stream read takes while events finish in under 20ms (a backlog of quick events, e.g. drops); slower events are read one at a time. 1 to %d; 1: one entry per read", pipeline.MaxReadBatch))
	fs.StringVar(&w.ConsumerName, "consumer-name", DefaultConsumerName(), "the worker's name in its consumer group, one per process (a worker refuses to start while a live process has it); unset: the hostname in Kubernetes (the pod's name, so a restarted container resumes its pending entries), hostname-pid elsewhere")
	fs.StringVar(&w.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "address serving /metrics, /healthz and /readyz (empty: off); the default, a free port on loopback, is logged at start")
	fs.DurationVar(&w.KillGrace, "kill-grace", DefaultKillGrace, "grace between SIGTERM and SIGKILL of a runner's process group, at most LOCK_TTL/10 (the lease's safety margin)"+
		rangeHelp("kill-grace")+"; unset: the smaller of "+fmtDur(DefaultKillGrace)+" and LOCK_TTL/10")
	fs.DurationVar(&w.DemoDuration, "demo-duration", 0, "typical length of a simulated run (runner demo; each run takes 0.5 to 1.5 times it; 0: instant)"+rangeHelp("demo-duration"))
	fs.StringVar(&w.RunRate, "run-rate", "", "run starts of this agent per period, shared by all its workers through Redis, e.g. 30/h; an event over it is re-queued until its turn (empty: none)")
	fs.IntVar(&w.RunRateBurst, "run-rate-burst", DefaultRunRateBurst, "run starts RUN_RATE lets go at once after a quiet spell")
	fs.StringVar(&w.RunLimits, "run-limits", "", "runs at once, shared by every worker: AGENT=N, field:PATH=N per value of an event field; "+
		"an event over a limit waits for a slot, :todo events first, then the values of fair:PATH in turns, weight:VALUE=W turns each; "+
		"e.g. rebase=4,field:metadata.component=1,fair:metadata.component,weight:KERNEL=3 (empty: none)")
	w.fs = fs
	fs.Int64Var(&w.DemoSeed, "demo-seed", 0, "seed of the simulated outcomes (runner demo)")
	fs.Float64Var(&w.BudgetIssueUSD, "budget-issue-usd", 0, "spend limit of one issue in USD, over every run of every agent, enforced on the agents' reservations (YMIR_CONTROL_FD); "+
		"an exhausted budget parks the issue until a maintainer raises it (`ymirflow budget approve`). 0: no limit")
	fs.Float64Var(&w.BudgetAgentUSD, "budget-agent-usd", 0, "spend limit of one agent on one issue in USD, over all its runs. 0: no limit")
	fs.StringVar(&w.Permits, "permits", "", "rate limits of the upstreams agents ask permits for, shared by every worker through Redis (GCRA): comma-separated "+
		"<upstream>=<n>/s, the upstreams jira, gitlab and llm:<model>; e.g. llm:claude=5/s,jira=10/s. A reported 429 pauses everyone for its Retry-After, then halves the rate for a minute. Unset: none limited")
	fs.DurationVar(&w.ProgressTimeout, "progress-timeout", 0, "a run whose agent reports no progress on its control channel (a usage report, a checkpoint, a progress request) "+
		"for this long loses its lease as a wedged handler's does at LOCK_MAX_HOLD: stopped and dead-lettered. 0: off"+rangeHelp("progress-timeout"))
}

// PermitRates is PERMITS, parsed.
func (w *Worker) PermitRates() (map[string]agentctl.Rate, error) {
	out := map[string]agentctl.Rate{}
	for _, f := range strings.Split(w.Permits, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, rate, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(strings.TrimSuffix(rate, "/s"))
		if !ok || err != nil || n < 1 || !strings.HasSuffix(rate, "/s") {
			return nil, fmt.Errorf("%q is not <upstream>=<n>/s with n at least 1", f)
		}
		out[name] = agentctl.Rate{PerSecond: n, Burst: 1}
	}
	if _, err := agentctl.NewRedisPermits(nil, "", out); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "agentctl: "))
	}
	return out, nil
}

// envName is a variable name RUNNER_ENV may list; a glob is such a prefix then '*'.
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var envName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// RunnerEnvPatterns returns RUNNER_ENV's entries (names and PREFIX_* globs), checked:
// no empty prefix ('*' alone would pass everything) and never REDIS_URL.
func (w *Worker) RunnerEnvPatterns() ([]string, error) {
	var out []string
	for _, f := range strings.Split(w.RunnerEnv, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, glob := strings.CutSuffix(f, "*")
		switch {
		case !envName().MatchString(name):
			return nil, fmt.Errorf("%q is neither a variable name nor a PREFIX_* glob", f)
		case !glob && name == "REDIS_URL":
			return nil, fmt.Errorf("REDIS_URL is never passed to agents (it holds the coordination store's credentials)")
		}
		out = append(out, f)
	}
	return out, nil
}

// AgentEnvPolicy is what an agent gets of the worker's environment: RUNNER_ENV's
// names and globs; ymirflow's Jira credentials only when named exactly; never the
// coordination store's settings (REDIS_URL, and redis-cli's REDISCLI_AUTH).
func (w *Worker) AgentEnvPolicy() (runners.EnvPolicy, error) {
	pass, err := w.RunnerEnvPatterns()
	if err != nil {
		return runners.EnvPolicy{}, err
	}
	return runners.EnvPolicy{Pass: pass, Credentials: []string{"JIRA_TOKEN", "JIRA_TOKEN_FILE", "JIRA_EMAIL"},
		Withheld: []string{"REDIS_URL", "REDISCLI_AUTH"}}, nil
}

// DefaultRunRateBurst is RUN_RATE_BURST's default: one at a time, so that over any
// period at most RUN_RATE's count plus one start.
const DefaultRunRateBurst = 1

// RunLimit is RUN_RATE with its burst, and whether it is set. Validate has checked it.
func (w *Worker) RunLimit() (ratelimit.Rate, bool) {
	if strings.TrimSpace(w.RunRate) == "" {
		return ratelimit.Rate{}, false
	}
	r, err := ratelimit.ParseRate(w.RunRate)
	if err != nil {
		return ratelimit.Rate{}, false
	}
	r.Burst = max(w.RunRateBurst, 1)
	return r, true
}

// Limits is RUN_LIMITS, parsed.
func (w *Worker) Limits() (lockmw.Limits, error) {
	l, err := lockmw.ParseLimits(w.RunLimits)
	if err != nil {
		return lockmw.Limits{}, fmt.Errorf("RUN_LIMITS (--run-limits): %w", err)
	}
	return l, nil
}

// Policies is ON_CONFLICT, parsed.
func (w *Worker) Policies() (lockmw.Policies, error) {
	p, err := lockmw.ParsePolicies(w.OnConflict)
	if err == nil {
		// An unknown type (a typo) would leave the type meant to the default rule.
		err = p.CheckTypes(event.WorkTypes())
	}
	if err != nil {
		// The setting names itself in the message; the library's field name goes.
		return lockmw.Policies{}, errors.New(strings.TrimPrefix(err.Error(), "lockmw: Config.Policies "))
	}
	return p, nil
}

// Scopes is LOCK_SCOPE, parsed.
func (w *Worker) Scopes() (lease.Scopes, error) {
	sc, err := lease.ParseScopes(w.LockScope)
	if err != nil {
		// The setting names itself in the message; the library's prefix goes.
		return lease.Scopes{}, errors.New(strings.TrimPrefix(err.Error(), lease.ErrBadScope.Error()+": "))
	}
	return sc, nil
}

// HeartbeatInterval is how often a lease is extended: LockTTL/3.
func (w *Worker) HeartbeatInterval() time.Duration { return w.LockTTL / 3 }

// ShutdownBudget is the longest a worker takes to exit after SIGTERM:
// BlockTime + 1 s + KillGrace. A pod's terminationGracePeriodSeconds must
// exceed it.
func (w *Worker) ShutdownBudget() time.Duration { return w.BlockTime + time.Second + w.KillGrace }

// MinLockTTL is the shortest LOCK_TTL accepted (the lease's own minimum).
const MinLockTTL = lease.MinTTL

// Validate checks the worker's settings.
func (w *Worker) Validate() error {
	var p problems
	w.Common.validate(&p)
	w.Jira.validate(&p)
	w.Tracing.validate(&p)
	validateAgentBranch(&p, w.Agent, w.Branch, false)
	checkSharedRate(&p, "run-rate", "run-rate-burst", w.RunRate, w.RunRateBurst)
	if w.RunRateBurst == 0 {
		p.add("run-rate-burst", "= 0 must be at least 1")
	}
	w.validateRunner(&p)
	w.derive()
	for name, d := range map[string]time.Duration{"lock-ttl": w.LockTTL, "lock-max-hold": w.LockMaxHold,
		"block-time": w.BlockTime, "max-idle-time": w.MaxIdleTime, "claim-interval": w.ClaimInterval,
		"kill-grace": w.KillGrace, "demo-duration": w.DemoDuration, "progress-timeout": w.ProgressTimeout} {
		checkRange(&p, name, d)
	}
	w.validateLease(&p)
	w.validateConflict(&p)
	w.validateLimits(&p)
	w.validateRunLimits(&p)
	w.validateProcess(&p)
	return p.err()
}

// validateRunLimits checks RUN_LIMITS.
func (w *Worker) validateRunLimits(p *problems) {
	if _, err := lockmw.ParseLimits(w.RunLimits); err != nil {
		p.add("run-limits", "= %q: %v", w.RunLimits, err)
	}
}

// validateRunner checks RUNNER and what it needs.
func (w *Worker) validateRunner(p *problems) {
	switch w.Runner {
	case "exec":
		if strings.TrimSpace(w.Exec) == "" {
			p.addEnv("exec", "RUNNER_EXEC", "is required when RUNNER (--runner) is exec")
		}
	case "demo":
	default:
		p.add("runner", "= %q must be exec or demo", w.Runner)
	}
}

// validateConflict checks ON_CONFLICT and LOCK_SCOPE, and that they go together.
func (w *Worker) validateConflict(p *problems) {
	policies, polErr := w.Policies()
	if polErr != nil {
		p.add("on-conflict", "= %q: %v", w.OnConflict, polErr)
	} else if policies.Uses(lockmw.Wait) && policies.Uses(lockmw.Coalesce, lockmw.Deliver, lockmw.Supersede) {
		p.add("on-conflict", "= %q: wait can be combined with drop and delay only: coalesce and deliver would queue behind a key "+
			"handed to the line's head (no run there yet to publish or read them), and supersede would take it from the head (docs/architecture.md, Waiting in line)", w.OnConflict)
	}
	if sc, err := w.Scopes(); err != nil {
		p.add("lock-scope", "= %q: %v", w.LockScope, err)
	} else if sc.Shared() && polErr == nil && policies.Uses(lockmw.Coalesce, lockmw.Deliver) {
		p.add("lock-scope", "= %q holds a shared key (issue or group), which ON_CONFLICT (--on-conflict) = %q cannot follow with coalesce or deliver: use drop or delay", w.LockScope, w.OnConflict)
	} else if sc.Issue && len(sc.Group) > 0 && polErr == nil && policies.Uses(lockmw.Wait) {
		p.add("lock-scope", "= %q holds two shared keys (issue and group), which ON_CONFLICT (--on-conflict) = %q cannot follow with wait: "+
			"an event waits in the line of one key; use issue or group alone", w.LockScope, w.OnConflict)
	} else if sc.Shared() && polErr == nil && policies.Uses(lockmw.Supersede) {
		p.add("lock-scope", "= %q holds a shared key (issue or group), which ON_CONFLICT (--on-conflict) = %q cannot follow with supersede: "+
			"the run holding a shared key may be another agent's or another issue's, which an event may not cancel; use drop or delay", w.LockScope, w.OnConflict)
	}
}

// validateLimits checks the counts: replicas to wait for, mailbox depth, retries,
// concurrency and read batch.
func (w *Worker) validateLimits(p *problems) {
	if w.BudgetIssueUSD < 0 || w.BudgetIssueUSD > 1e6 {
		p.add("budget-issue-usd", "= %g must be between 0 (off) and 1000000", w.BudgetIssueUSD)
	}
	if w.BudgetAgentUSD < 0 || w.BudgetAgentUSD > 1e6 {
		p.add("budget-agent-usd", "= %g must be between 0 (off) and 1000000", w.BudgetAgentUSD)
	}
	if _, err := w.PermitRates(); err != nil {
		p.add("permits", "= %q: %v", w.Permits, err)
	}

	if w.LockWaitReplicas < 0 || w.LockWaitReplicas > 16 {
		p.add("lock-wait-replicas", "= %d must be between 0 and 16", w.LockWaitReplicas)
	}
	if w.LockWaitAOF && w.LockWaitReplicas == 0 {
		p.add("lock-wait-aof", "is set but LOCK_WAIT_REPLICAS (--lock-wait-replicas) is 0: set how many replicas must acknowledge")
	}
	if w.MailboxDepth < 1 || w.MailboxDepth > 100_000 {
		p.add("mailbox-depth", "= %d must be between 1 and 100000", w.MailboxDepth)
	}
	if w.MaxRetries < 1 {
		p.add("max-retries", "= %d must be at least 1", w.MaxRetries)
	}
	if w.Concurrency < 1 || w.Concurrency > 1024 {
		p.add("concurrency", "= %d must be between 1 and 1024", w.Concurrency)
	}
	if w.ReadBatch < 1 || w.ReadBatch > pipeline.MaxReadBatch {
		p.add("read-batch", "= %d must be between 1 and %d", w.ReadBatch, pipeline.MaxReadBatch)
	}
}

// validateProcess checks what names and serves the process: its consumer name, its
// metrics address and the environment its runner passes on.
func (w *Worker) validateProcess(p *problems) {
	switch {
	case w.ConsumerName == "":
		p.add("consumer-name", "is required (the hostname could not be read)")
	case strings.IndexFunc(w.ConsumerName, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		p.add("consumer-name", "= %q must not contain spaces or control characters", w.ConsumerName)
	}
	if w.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(w.MetricsAddr); err != nil {
			p.add("metrics-addr", "= %q must be host:port or :port", w.MetricsAddr)
		} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			p.add("metrics-addr", "= %q has an invalid port", w.MetricsAddr)
		}
	}
	if _, err := w.RunnerEnvPatterns(); err != nil {
		p.add("runner-env", "= %q: %v", w.RunnerEnv, err)
	}
}
