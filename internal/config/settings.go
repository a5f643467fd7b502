package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Defaults shared by the commands and by the deployment manifests. Where a library
// owns a setting (the lease, the router, the Jira client, the runner, the fetcher), the
// default is the library's, referenced here, never re-declared.
const (
	DefaultRedisURL       = "redis://127.0.0.1:6379/0"
	DefaultNamespace      = pipeline.DefaultNamespace
	DefaultLogLevel       = "info"
	DefaultLogFormat      = "json"
	DefaultMaxLen         = pipeline.DefaultMaxLen
	DefaultJiraAPI        = "auto"
	DefaultJiraTimeout    = jira.DefaultTimeout
	DefaultJiraMaxRetries = jira.DefaultMaxRetries
	DefaultJiraRateLimit  = jira.DefaultRateLimit
	DefaultJQL            = "project = RHEL AND assignee = jotnar-project"
	DefaultTriggerGroup   = "Red Hat Employee"
	DefaultRunner         = "exec"
	DefaultLockTTL        = lockmw.DefaultTTL
	DefaultLockMaxHold    = lockmw.DefaultMaxHold
	DefaultOnConflict     = string(lockmw.Drop)
	DefaultBlockTime      = pipeline.DefaultBlockTime
	DefaultMaxIdleTime    = pipeline.DefaultMaxIdleTime
	DefaultClaimInterval  = pipeline.DefaultClaimInterval
	DefaultMaxRetries     = pipeline.DefaultMaxRetries
	DefaultConcurrency    = 1
	DefaultReadBatch      = pipeline.DefaultReadBatch
	// DefaultMetricsAddr is a free port on loopback, so that several workers (and the
	// webhook) share a machine; a deployment that scrapes them sets METRICS_ADDR (the
	// manifests: :9090). The port taken is logged at start.
	DefaultMetricsAddr    = "127.0.0.1:0"
	DefaultKillGrace      = handlers.DefaultKillGrace
	DefaultFetchInterval  = 5 * time.Minute
	DefaultStaleThreshold = fetcher.DefaultStaleLabelThreshold
	DefaultFakeJiraAddr   = "127.0.0.1:8081" // the console has 8080, the webhook 8082
	DefaultFakeJiraIssues = 20
	DefaultDemoIssues     = 40
	DefaultDemoDuration   = 400 * time.Millisecond // typical simulated agent run at --speed 1
	DefaultMaxEventBytes  = pipeline.DefaultMaxEventBytes
	DefaultWebAddr        = "127.0.0.1:8080"
	DefaultWebRefresh     = 2 * time.Second
	DefaultConsumerIdle   = time.Minute
)

// Agents are the agent names, in pipeline order. Branches are the target
// branches of the downstream agents.
var (
	Agents   = pipeline.Agents
	Branches = pipeline.Branches
)

// LogLevels are the accepted LOG_LEVEL values (zerolog's level names).
var LogLevels = []string{"trace", "debug", "info", "warn", "error", "fatal", "panic", "disabled"}

// Common is the settings of every command that talks to Redis.
type Common struct {
	RedisURL  string // --redis-url, REDIS_URL: redis:// or rediss:// (TLS); user and password may be in the URL
	Namespace string // --ymir-namespace, YMIR_NAMESPACE: prefix of every stream and key
	LogLevel  string // --log-level, LOG_LEVEL: trace|debug|info|warn|error|fatal|panic|disabled
	LogFormat string // --log-format, LOG_FORMAT: json|console
	MaxLen    int64  // --max-len, MAX_LEN: approximate MAXLEN of every stream written (0: never trim)
	// MaxEventBytes (--max-event-bytes, MAX_EVENT_BYTES) bounds one stream entry: bigger
	// ones are refused at publish and dead-lettered (truncated) when read.
	MaxEventBytes int

	emptyRedisOK bool // demo: an empty REDIS_URL means the embedded Redis
}

// Register defines the common flags on fs.
func (c *Common) Register(fs *flag.FlagSet) { c.register(fs, DefaultRedisURL) }

func (c *Common) register(fs *flag.FlagSet, redisDefault string) {
	fs.StringVar(&c.RedisURL, "redis-url", redisDefault, "Redis URL: redis://[user:password@]host:port/db, or rediss:// for TLS")
	fs.StringVar(&c.Namespace, "ymir-namespace", DefaultNamespace, "prefix of every stream and key, so that several pipelines can share one Redis")
	fs.StringVar(&c.LogLevel, "log-level", DefaultLogLevel, "log level: "+strings.Join(LogLevels, "|"))
	fs.StringVar(&c.LogFormat, "log-format", DefaultLogFormat, "log format: json|console")
	fs.Int64Var(&c.MaxLen, "max-len", DefaultMaxLen, "approximate maximum length of every stream written (0: never trim)")
	fs.IntVar(&c.MaxEventBytes, "max-event-bytes", DefaultMaxEventBytes, "largest stream entry (all fields) published or run; a bigger one read from a stream is dead-lettered, truncated")
}

// Validate checks the common settings.
func (c *Common) Validate() error {
	var p problems
	c.validate(&p)
	return p.err()
}

func (c *Common) validate(p *problems) {
	switch {
	case c.RedisURL == "" && c.emptyRedisOK:
	case c.RedisURL == "":
		p.add("redis-url", "is required")
	default:
		if msg := checkRedisURL(c.RedisURL); msg != "" {
			p.add("redis-url", "%s", msg)
		}
	}
	switch {
	case c.Namespace == "":
		p.add("ymir-namespace", "is required")
	case strings.ContainsAny(c.Namespace, "*?[]\\{} \t\r\n"):
		p.add("ymir-namespace", "= %q must not contain spaces, braces or glob characters", c.Namespace)
	}
	if !oneOf(c.LogLevel, LogLevels...) {
		p.add("log-level", "= %q must be one of %s", c.LogLevel, strings.Join(LogLevels, "|"))
	}
	if !oneOf(c.LogFormat, "json", "console") {
		p.add("log-format", "= %q must be json or console", c.LogFormat)
	}
	if c.MaxLen < 0 {
		p.add("max-len", "= %d must not be negative (0 disables trimming)", c.MaxLen)
	}
	if c.MaxEventBytes < MinMaxEventBytes || c.MaxEventBytes > MaxMaxEventBytes {
		p.add("max-event-bytes", "= %d must be between %d and %d", c.MaxEventBytes, MinMaxEventBytes, MaxMaxEventBytes)
	}
}

// redisURLForm is the expected form of REDIS_URL, for messages about one that is not.
const redisURLForm = "redis://host:6379/0 (in general redis://[user:password@]host:port/db; rediss:// for TLS)"
const redisURLGeneral = "(in general redis://[user:password@]host:port/db; rediss:// for TLS)"

// checkRedisURL returns what is wrong with raw as a Redis URL ("" when nothing), value
// (redacted) included, ending with the expected form.
func checkRedisURL(raw string) string {
	if !strings.Contains(raw, "://") {
		// host:port is the usual slip; show it mended (the redaction sees a URL then).
		if mended := RedactURL("redis://" + raw); !strings.HasPrefix(mended, "<") {
			as := mended
			if u, err := url.Parse(mended); err == nil && strings.Trim(u.Path, "/") == "" {
				as = strings.TrimSuffix(mended, "/") + "/0"
			}
			return fmt.Sprintf("= %q has no scheme: write it as %s %s", strings.TrimPrefix(mended, "redis://"),
				as, redisURLGeneral)
		}
		return "is not a URL: write it as " + redisURLForm
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "is not a URL: write it as " + redisURLForm
	}
	shown := fmt.Sprintf("= %q", RedactURL(raw))
	switch u.Scheme {
	case "redis", "rediss":
		if u.Host == "" {
			return shown + " has no host: write it as " + redisURLForm
		}
		if db := strings.Trim(u.Path, "/"); db != "" {
			if n, err := strconv.Atoi(db); err != nil || n < 0 {
				return shown + " has a database that is not a number: write it as " + redisURLForm
			}
		}
	default:
		return shown + " must start with redis:// or rediss:// (unix sockets are not supported): write it as " + redisURLForm
	}
	return ""
}

// httpURLProblem returns what is wrong with raw as an http(s) URL ("" when nothing),
// value (redacted) included, with an example of the expected form.
func httpURLProblem(raw, example string) string {
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		return ""
	}
	shown := RedactURL(raw)
	if !strings.Contains(raw, "://") {
		if m := RedactURL("https://" + raw); !strings.HasPrefix(m, "<") {
			shown = strings.TrimPrefix(m, "https://")
		}
		if strings.HasPrefix(shown, "<") {
			return "is not a URL: it must be an http:// or https:// URL, e.g. " + example
		}
		return fmt.Sprintf("= %q has no scheme: it must be an http:// or https:// URL, e.g. %s", shown, example)
	}
	if strings.HasPrefix(shown, "<") {
		return "is not a URL: it must be an http:// or https:// URL, e.g. " + example
	}
	return fmt.Sprintf("= %q must be an http:// or https:// URL, e.g. %s", shown, example)
}

// Bounds of MAX_EVENT_BYTES: a triage request is a few hundred bytes; Redis's own
// limit on one string is 512 MB.
const (
	MinMaxEventBytes = 4 << 10
	MaxMaxEventBytes = 256 << 20
)

// RedactedRedisURL is RedisURL with its password replaced, for logs and
// error messages.
func (c *Common) RedactedRedisURL() string { return RedactURL(c.RedisURL) }

// RedactURL returns raw with any password (also in ?password= and the like)
// replaced by "xxxxx". A string that does not parse as a URL is returned as
// "<unparseable URL>", since it may hold a password in an unknown place.
func RedactURL(raw string) string { return redact.URL(raw) }

// Jira is the settings of the Jira client, embedded by the commands that
// read or write Jira.
type Jira struct {
	JiraURL          string        // --jira-url, JIRA_URL: base URL; empty: Jira writes are logged, not sent
	JiraEmail        string        // --jira-email, JIRA_EMAIL: account e-mail for Jira Cloud basic auth
	JiraToken        string        // --jira-token, JIRA_TOKEN: API token (Cloud) or personal access token (Server/DC)
	JiraTokenFile    string        // --jira-token-file, JIRA_TOKEN_FILE: file holding the token (read by Token)
	JiraJQL          string        // --jira-jql, JIRA_JQL: the fetcher's search
	JiraTriggerGroup string        // --jira-trigger-group, JIRA_TRIGGER_GROUP: group whose members may add ymir_todo (empty: anyone)
	JiraAPI          string        // --jira-api, JIRA_API: cloud|server|auto (auto: cloud for *.atlassian.net)
	JiraCommentGroup string        // --jira-comment-group, JIRA_COMMENT_GROUP: group that comments are restricted to (empty: visible to all)
	JiraTimeout      time.Duration // --jira-timeout, JIRA_TIMEOUT: bound of one HTTP attempt
	JiraMaxRetries   int           // --jira-max-retries, JIRA_MAX_RETRIES: retries after a 429, 5xx or network error (negative: none)
	JiraRateLimit    float64       // --jira-rate-limit, JIRA_RATE_LIMIT: requests per second (negative: no limit)
	DryRun           bool          // --dry-run, DRY_RUN: log Jira writes instead of sending them
}

// Register defines the Jira flags on fs.
func (j *Jira) Register(fs *flag.FlagSet) {
	fs.StringVar(&j.JiraURL, "jira-url", "", "Jira base URL, e.g. https://example.atlassian.net/ (empty: Jira writes are logged, not sent)")
	fs.StringVar(&j.JiraEmail, "jira-email", "", "account e-mail for Jira Cloud basic authentication")
	fs.StringVar(&j.JiraToken, "jira-token", "", "Jira API token (Cloud) or personal access token (Server/DC); prefer --jira-token-file")
	fs.StringVar(&j.JiraTokenFile, "jira-token-file", "", "file that holds the Jira token, read once at start-up: restart the process after rotating it")
	fs.StringVar(&j.JiraJQL, "jira-jql", DefaultJQL, "JQL of the fetcher's search")
	fs.StringVar(&j.JiraTriggerGroup, "jira-trigger-group", DefaultTriggerGroup, "Jira group whose members may trigger work with ymir_todo (empty: anyone)")
	fs.StringVar(&j.JiraAPI, "jira-api", DefaultJiraAPI, "Jira REST flavour: cloud (/rest/api/3), server (/rest/api/2) or auto")
	fs.StringVar(&j.JiraCommentGroup, "jira-comment-group", "", "Jira group that the pipeline's comments are restricted to (empty: visible to all)")
	fs.DurationVar(&j.JiraTimeout, "jira-timeout", DefaultJiraTimeout, "bound of one Jira HTTP attempt"+rangeHelp("jira-timeout"))
	fs.IntVar(&j.JiraMaxRetries, "jira-max-retries", DefaultJiraMaxRetries, "retries of a Jira request after a 429, a 5xx or a network error (negative: none)")
	fs.Float64Var(&j.JiraRateLimit, "jira-rate-limit", DefaultJiraRateLimit, "Jira requests per second, all requests of the process together (negative: no limit)")
	fs.BoolVar(&j.DryRun, "dry-run", false, "log Jira writes instead of sending them")
}

// APIFlavour is JiraAPI as internal/jira's Options.API takes it: "cloud",
// "server", or "" for auto.
func (j *Jira) APIFlavour() string {
	if j.JiraAPI == "auto" {
		return ""
	}
	return j.JiraAPI
}

// Validate checks the Jira settings.
func (j *Jira) Validate() error {
	var p problems
	j.validate(&p)
	return p.err()
}

func (j *Jira) validate(p *problems) {
	if j.JiraURL != "" {
		if msg := httpURLProblem(j.JiraURL, "https://example.atlassian.net/"); msg != "" {
			p.add("jira-url", "%s", msg)
		}
	}
	if !oneOf(j.JiraAPI, "cloud", "server", "auto") {
		p.add("jira-api", "= %q must be cloud, server or auto", j.JiraAPI)
	}
	checkRange(p, "jira-timeout", j.JiraTimeout)
	if j.JiraRateLimit == 0 {
		p.add("jira-rate-limit", "= 0 would block every request (negative: no limit)")
	}
	if j.JiraToken != "" && j.JiraTokenFile != "" {
		p.add("jira-token-file", "and JIRA_TOKEN (--jira-token) are both set; set one")
	}
	if j.JiraTokenFile != "" {
		b, err := os.ReadFile(j.JiraTokenFile)
		switch {
		case err != nil:
			p.add("jira-token-file", "= %q cannot be read: %v", j.JiraTokenFile, unwrapPathErr(err))
		case strings.TrimSpace(string(b)) == "":
			p.add("jira-token-file", "= %q is empty", j.JiraTokenFile)
		}
	}
	hasToken := j.JiraToken != "" || j.JiraTokenFile != ""
	if j.JiraEmail != "" && !hasToken {
		p.add("jira-email", "is set but neither JIRA_TOKEN (--jira-token) nor JIRA_TOKEN_FILE (--jira-token-file) is")
	}
	if j.JiraAPI == "cloud" && hasToken && j.JiraEmail == "" {
		p.add("jira-email", "is required with JIRA_API=cloud: Jira Cloud authenticates with e-mail and API token")
	}
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Token returns the Jira token: JiraToken, or the trimmed content of
// JiraTokenFile, read now. Both empty yields "" (anonymous).
func (j *Jira) Token() (string, error) {
	if j.JiraToken != "" || j.JiraTokenFile == "" {
		return j.JiraToken, nil
	}
	b, err := os.ReadFile(j.JiraTokenFile)
	if err != nil {
		return "", &SettingError{Env: "JIRA_TOKEN_FILE", Flag: "jira-token-file",
			Msg: fmt.Sprintf("= %q cannot be read: %v", j.JiraTokenFile, unwrapPathErr(err))}
	}
	return strings.TrimSpace(string(b)), nil
}

// Worker is the settings of `ymirflow worker`: one agent's router.
type Worker struct {
	Common
	Jira

	Agent         string        // --agent, AGENT: triage|rebase|backport|rebuild
	Branch        string        // --branch, BRANCH: c9s|c10s; required for every agent but triage
	Runner        string        // --runner, RUNNER: exec|demo
	Exec          string        // --exec, RUNNER_EXEC: command run with /bin/sh -c per event (runner exec)
	RunnerEnv     string        // --runner-env, RUNNER_ENV: variables passed to the runner besides the base (NAME,PREFIX_*)
	LockTTL       time.Duration // --lock-ttl, LOCK_TTL: lease TTL; the heartbeat runs every LOCK_TTL/3
	LockMaxHold   time.Duration // --lock-max-hold, LOCK_MAX_HOLD: a lease is given up after this long
	OnConflict    string        // --on-conflict, ON_CONFLICT: drop|coalesce
	BlockTime     time.Duration // --block-time, BLOCK_TIME: XREADGROUP BLOCK
	MaxIdleTime   time.Duration // --max-idle-time, MAX_IDLE_TIME: pending entries idle this long are claimed
	ClaimInterval time.Duration // --claim-interval, CLAIM_INTERVAL: how often pending entries are checked
	MaxRetries    int           // --max-retries, MAX_RETRIES: attempts at a failing event before the DLQ
	Concurrency   int           // --concurrency, CONCURRENCY: subscriptions per input stream
	ReadBatch     int           // --read-batch, READ_BATCH: most entries one stream read takes while the worker keeps up
	ConsumerName  string        // --consumer-name, CONSUMER_NAME: one per process (default: DefaultConsumerName)
	MetricsAddr   string        // --metrics-addr, METRICS_ADDR: /metrics, /healthz, /readyz (empty: off)
	KillGrace     time.Duration // --kill-grace, KILL_GRACE: runner SIGTERM → SIGKILL grace
	DemoDuration  time.Duration // --demo-duration, DEMO_DURATION: typical length of a simulated run (runner demo)
	DemoSeed      int64         // --demo-seed, DEMO_SEED: seed of the simulated outcomes (runner demo)

	fs *flag.FlagSet // set by Register: tells which settings were given (derive)
}

// Register defines the worker's flags on fs.
func (w *Worker) Register(fs *flag.FlagSet) {
	w.Common.Register(fs)
	w.Jira.Register(fs)
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
	fs.StringVar(&w.OnConflict, "on-conflict", DefaultOnConflict, "event for an issue locked by another holder: drop or coalesce")
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
	w.fs = fs
	fs.Int64Var(&w.DemoSeed, "demo-seed", 0, "seed of the simulated outcomes (runner demo)")
}

// envName is a variable name RUNNER_ENV may list; a glob is such a prefix then '*'.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

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
		case !envName.MatchString(name):
			return nil, fmt.Errorf("%q is neither a variable name nor a PREFIX_* glob", f)
		case !glob && name == "REDIS_URL":
			return nil, fmt.Errorf("REDIS_URL is never passed to agents (it holds the coordination store's credentials)")
		}
		out = append(out, f)
	}
	return out, nil
}

// HeartbeatInterval is how often a lease is extended: LockTTL/3.
func (w *Worker) HeartbeatInterval() time.Duration { return w.LockTTL / 3 }

// ShutdownBudget is the longest a worker takes to exit after SIGTERM:
// BlockTime + 1 s + KillGrace. A pod's terminationGracePeriodSeconds must
// exceed it.
func (w *Worker) ShutdownBudget() time.Duration { return w.BlockTime + time.Second + w.KillGrace }

// MinLockTTL is the shortest LOCK_TTL accepted (the lease's own minimum).
const MinLockTTL = lockmw.MinTTL

// Validate checks the worker's settings.
func (w *Worker) Validate() error {
	var p problems
	w.Common.validate(&p)
	w.Jira.validate(&p)
	validateAgentBranch(&p, w.Agent, w.Branch, false)
	switch w.Runner {
	case "exec":
		if strings.TrimSpace(w.Exec) == "" {
			p.addEnv("exec", "RUNNER_EXEC", "is required when RUNNER (--runner) is exec")
		}
	case "demo":
	default:
		p.add("runner", "= %q must be exec or demo", w.Runner)
	}
	w.derive()
	for name, d := range map[string]time.Duration{"lock-ttl": w.LockTTL, "lock-max-hold": w.LockMaxHold,
		"block-time": w.BlockTime, "max-idle-time": w.MaxIdleTime, "claim-interval": w.ClaimInterval,
		"kill-grace": w.KillGrace, "demo-duration": w.DemoDuration} {
		checkRange(&p, name, d)
	}
	w.validateLease(&p)
	if !oneOf(w.OnConflict, string(lockmw.Drop), string(lockmw.Coalesce)) {
		p.add("on-conflict", "= %q must be drop or coalesce", w.OnConflict)
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
	return p.err()
}

// ValidateAgentBranch checks an agent name and a branch as the worker and
// enqueue commands take them: the agent is one of [Agents]; triage takes no
// branch, every other agent one of [Branches].
func ValidateAgentBranch(agent, branch string) error {
	var p problems
	validateAgentBranch(&p, agent, branch, false)
	return p.err()
}

func validateAgentBranch(p *problems, agent, branch string, flagOnly bool) {
	add := p.add
	if flagOnly {
		add = p.addFlag
	}
	switch {
	case agent == "":
		add("agent", "is required: one of %s", strings.Join(Agents, "|"))
		return
	case !oneOf(agent, Agents...):
		add("agent", "= %q is not an agent: one of %s", agent, strings.Join(Agents, "|"))
		return
	}
	switch {
	case agent == "triage" && branch != "":
		add("branch", "= %q is not taken by agent triage, which reads every branch's issues", branch)
	case agent != "triage" && branch == "":
		add("branch", "is required for agent %s: one of %s", agent, strings.Join(Branches, "|"))
	case agent != "triage" && !oneOf(branch, Branches...):
		add("branch", "= %q is not a branch: one of %s", branch, strings.Join(Branches, "|"))
	}
}

// Fetch is the settings of `ymirflow fetch`: the Jira sweep.
type Fetch struct {
	Common
	Jira

	Once                bool          // --once, ONCE: one sweep, then exit
	Interval            time.Duration // --interval, INTERVAL: time between sweeps without --once
	MaxIssues           int           // --max-issues, MAX_ISSUES: issues published per sweep (0: no limit)
	StaleLabelThreshold time.Duration // --stale-label-threshold, STALE_LABEL_THRESHOLD: in-flight labels older than this are recovered
}

// Register defines the fetcher's flags on fs.
func (f *Fetch) Register(fs *flag.FlagSet) {
	f.Common.Register(fs)
	f.Jira.Register(fs)
	required(fs, "jira-url", "required: the fetcher searches Jira")
	fs.BoolVar(&f.Once, "once", false, "run one sweep and exit")
	fs.DurationVar(&f.Interval, "interval", DefaultFetchInterval, "time between sweeps (without --once)"+rangeHelp("interval"))
	fs.IntVar(&f.MaxIssues, "max-issues", 0, "issues published per sweep (0: no limit)")
	fs.DurationVar(&f.StaleLabelThreshold, "stale-label-threshold", DefaultStaleThreshold, "an in-flight label on an issue not updated for this long is recovered"+rangeHelp("stale-label-threshold"))
}

// Validate checks the fetcher's settings.
func (f *Fetch) Validate() error {
	var p problems
	f.Common.validate(&p)
	f.Jira.validate(&p)
	if f.JiraURL == "" {
		p.add("jira-url", "is required: the fetcher searches Jira")
	}
	if strings.TrimSpace(f.JiraJQL) == "" {
		p.add("jira-jql", "is required: the fetcher's search")
	}
	if !f.Once && !inRange("interval", f.Interval) {
		checkRange(&p, "interval", f.Interval)
		p[len(p)-1].(*SettingError).Msg += " (or use ONCE (--once))" //nolint:errorlint // problems holds *SettingError values, never wrapped
	}
	if f.MaxIssues < 0 {
		p.add("max-issues", "= %d must not be negative (0: no limit)", f.MaxIssues)
	}
	checkRange(&p, "stale-label-threshold", f.StaleLabelThreshold)
	return p.err()
}

// Demo is the settings of `ymirflow demo`: the whole pipeline in one process.
type Demo struct {
	Common         // REDIS_URL defaults to empty here: an embedded Redis
	Issues  int    // --issues, ISSUES: sample issues in the fake Jira
	Seed    int64  // --seed, SEED: seed of the simulated agents' outcomes
	Speed   string // --speed, SPEED: a factor (2, 2x: twice as fast) or the typical agent run (300ms, 0s: instant)
	JSON    bool   // --json, JSON: print the summary as JSON
	Keep    bool   // --keep, KEEP: keep the namespace in a real Redis, or the embedded Redis serving until Ctrl-C
	LogFile string // --log-file, LOG_FILE: where the workers' logs go ("-": stderr; empty: a new temp file)
	// Web (--web, DEMO_WEB) is the listen address of the operator console over the
	// demo's run ("": none); the embedded Redis keeps serving it until Ctrl-C.
	Web string
}

// Register defines the demo's flags on fs.
func (d *Demo) Register(fs *flag.FlagSet) {
	d.Common.emptyRedisOK = true
	d.Common.register(fs, "")
	fs.Lookup("redis-url").Usage = "Redis URL (empty: an embedded Redis in this process; a real one gets a fresh namespace, deleted at the end unless --keep)"
	fs.Lookup("ymir-namespace").Usage = "prefix of every stream and key; on a real Redis it must be unused (unset: a fresh ymir-demo-<random>)"
	fs.IntVar(&d.Issues, "issues", DefaultDemoIssues, "sample issues in the fake Jira")
	fs.Int64Var(&d.Seed, "seed", 1, "seed of the simulated agents' outcomes")
	fs.StringVar(&d.Speed, "speed", "1", "speed of the simulated agents: a factor (2 or 2x: twice as fast, 0.5: half as fast) or the typical run, e.g. 300ms (0s: instant); at 1 a run takes about "+fmtDur(DefaultDemoDuration))
	fs.BoolVar(&d.JSON, "json", false, "print the summary as JSON (progress goes to stderr)")
	flagOnly(fs, "json")
	fs.BoolVar(&d.Keep, "keep", false, "keep the demo's data: its namespace in a real Redis, or the embedded Redis serving until Ctrl-C")
	fs.StringVar(&d.LogFile, "log-file", "", "file that receives the workers' logs (-: stderr; empty: a new file in the temp dir)")
	stringVarEnv(fs, &d.Web, "web", "DEMO_WEB", "", "serve the operator console over the demo's run at this address, e.g. 127.0.0.1:8080 (empty: none)")
}

// AgentDuration is the typical simulated agent run that Speed asks for (0: instant).
func (d *Demo) AgentDuration() (time.Duration, error) {
	s := strings.TrimSpace(d.Speed)
	if s == "" {
		return DefaultDemoDuration, nil
	}
	if f, err := strconv.ParseFloat(strings.TrimSuffix(strings.ToLower(s), "x"), 64); err == nil {
		if f <= 0 || f != f {
			return 0, fmt.Errorf("= %q: a factor must be positive (0s for instant runs)", d.Speed)
		}
		return time.Duration(float64(DefaultDemoDuration) / f), nil
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("= %q is neither a factor (2, 0.5x) nor a duration (300ms)", d.Speed)
	}
	if dur < 0 {
		return 0, fmt.Errorf("= %q must not be negative", d.Speed)
	}
	return dur, nil
}

// Validate checks the demo's settings.
func (d *Demo) Validate() error {
	var p problems
	d.Common.emptyRedisOK = true
	d.Common.validate(&p)
	if d.Issues < 1 {
		p.add("issues", "= %d must be at least 1", d.Issues)
	}
	if _, err := d.AgentDuration(); err != nil {
		p.add("speed", "%s", err.Error())
	}
	if d.Web != "" {
		if _, _, err := net.SplitHostPort(d.Web); err != nil {
			p.add("web", "= %q must be host:port or :port", d.Web)
		}
	}
	return p.err()
}

// Defaults of `ymirflow dev`.
const (
	DefaultDevRedisAddr    = "127.0.0.1:6380" // not 6379: a real Redis is often there
	DefaultDevInterval     = 30 * time.Second
	DefaultDevIssues       = 20
	DefaultDevDemoDuration = 2 * time.Second
)

// Dev is the settings of `ymirflow dev`: a whole local pipeline until Ctrl-C.
type Dev struct {
	Common // REDIS_URL empty here: the embedded Redis
	Jira   // JIRA_URL empty: the fake Jira

	Exec      string // --exec, RUNNER_EXEC: every worker runs it (empty: the demo runner)
	RunnerEnv string // --runner-env, RUNNER_ENV: as the worker's
	// RedisAddr (--embedded-redis-addr, EMBEDDED_REDIS_ADDR) is where the embedded Redis
	// listens, so that other terminals reach it.
	RedisAddr    string
	WebAddr      string        // --web-addr, WEB_ADDR: the console
	FakeJiraAddr string        // --fakejira-addr, FAKEJIRA_ADDR: the fake Jira
	WebhookAddr  string        // --webhook-addr, WEBHOOK_ADDR: the webhook receiver
	Interval     time.Duration // --interval, INTERVAL: time between the fetcher's sweeps
	Issues       int           // --issues, ISSUES: sample issues in the fake Jira
	Seed         int64         // --seed, SEED: seed of the sample issues and simulated outcomes
	DemoDuration time.Duration // --demo-duration, DEMO_DURATION: typical simulated run (demo runner)
	LogDir       string        // --log-dir, LOG_DIR: where each component's log goes (empty: a new temp dir)
}

// Register defines dev's flags on fs.
func (d *Dev) Register(fs *flag.FlagSet) {
	d.Common.emptyRedisOK = true
	d.Common.register(fs, "")
	fs.Lookup("redis-url").Usage = "Redis URL (empty: an embedded Redis in this process, at --embedded-redis-addr)"
	d.Jira.Register(fs)
	fs.Lookup("jira-url").Usage = "a real Jira's base URL, e.g. https://example.atlassian.net/ (empty: a fake Jira with sample issues, at --fakejira-addr)"
	stringVarEnv(fs, &d.Exec, "exec", "RUNNER_EXEC", "", "your agent: every worker runs it with /bin/sh -c per event, as worker --runner exec --exec does (empty: simulated agents)")
	fs.StringVar(&d.RunnerEnv, "runner-env", "", "variables passed to --exec besides the base set, as the worker's RUNNER_ENV")
	fs.StringVar(&d.RedisAddr, "embedded-redis-addr", DefaultDevRedisAddr, "listen address of the embedded Redis (without REDIS_URL)")
	fs.StringVar(&d.WebAddr, "web-addr", DefaultWebAddr, "listen address of the console")
	fs.StringVar(&d.FakeJiraAddr, "fakejira-addr", DefaultFakeJiraAddr, "listen address of the fake Jira (without JIRA_URL)")
	fs.StringVar(&d.WebhookAddr, "webhook-addr", "127.0.0.1"+DefaultWebhookAddr, "listen address of the webhook receiver (the fake Jira sends it its deliveries)")
	fs.DurationVar(&d.Interval, "interval", DefaultDevInterval, "time between the fetcher's sweeps"+rangeHelp("interval"))
	fs.IntVar(&d.Issues, "issues", DefaultDevIssues, "sample issues in the fake Jira")
	fs.Int64Var(&d.Seed, "seed", 1, "seed of the sample issues and of the simulated agents' outcomes")
	fs.DurationVar(&d.DemoDuration, "demo-duration", DefaultDevDemoDuration, "typical length of a simulated agent run (without --exec; each takes 0.5 to 1.5 times it)"+rangeHelp("demo-duration"))
	fs.StringVar(&d.LogDir, "log-dir", "", "directory that receives one log file per component (empty: a new one in the temp dir)")
}

// Validate checks dev's settings.
func (d *Dev) Validate() error {
	var p problems
	d.Common.emptyRedisOK = true
	d.Common.validate(&p)
	d.Jira.validate(&p)
	for name, addr := range map[string]string{"embedded-redis-addr": d.RedisAddr, "web-addr": d.WebAddr,
		"fakejira-addr": d.FakeJiraAddr, "webhook-addr": d.WebhookAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			p.add(name, "= %q must be host:port or :port, e.g. 127.0.0.1:8080", addr)
		}
	}
	checkRange(&p, "interval", d.Interval)
	checkRange(&p, "demo-duration", d.DemoDuration)
	if d.Issues < 0 {
		p.add("issues", "= %d must not be negative", d.Issues)
	}
	w := Worker{RunnerEnv: d.RunnerEnv}
	if _, err := w.RunnerEnvPatterns(); err != nil {
		p.add("runner-env", "= %q: %v", d.RunnerEnv, err)
	}
	return p.err()
}

// Enqueue is the settings of `ymirflow enqueue`; the issue keys are the
// positional arguments.
type Enqueue struct {
	Common
	Agent         string // --agent (flag only)
	Branch        string // --branch (flag only): every agent but triage
	UserTriggered bool   // --user-triggered (flag only): publish to the :todo stream
}

// Register defines enqueue's flags on fs.
func (e *Enqueue) Register(fs *flag.FlagSet) {
	e.Common.Register(fs)
	fs.StringVar(&e.Agent, "agent", "triage", "agent whose stream gets the requests: "+strings.Join(Agents, "|"))
	fs.StringVar(&e.Branch, "branch", "", "target branch: "+strings.Join(Branches, "|")+" (every agent but triage)")
	fs.BoolVar(&e.UserTriggered, "user-triggered", false, "publish as user-triggered work (the :todo stream)")
	flagOnly(fs, "agent", "branch", "user-triggered")
	required(fs, "branch", "required for every agent but triage")
}

// Validate checks enqueue's settings.
func (e *Enqueue) Validate() error {
	var p problems
	e.Common.validate(&p)
	validateAgentBranch(&p, e.Agent, e.Branch, true)
	return p.err()
}

// Inspect is the settings of the inspection commands (pending, locks,
// streams, history, replay, dlq).
type Inspect struct {
	Common
	JSON bool // --json (flag only): print JSON instead of a table
}

// Register defines the inspection flags on fs.
func (i *Inspect) Register(fs *flag.FlagSet) {
	i.Common.Register(fs)
	fs.BoolVar(&i.JSON, "json", false, "print JSON instead of a table")
	flagOnly(fs, "json")
}

// Validate checks the inspection settings.
func (i *Inspect) Validate() error { return i.Common.Validate() }

// boolVarEnv defines a bool flag read from an environment variable whose name
// is not derived from the flag's.
func boolVarEnv(fs *flag.FlagSet, p *bool, name, env string, value bool, usage string) {
	fs.BoolVar(p, name, value, usage)
	settingOf(fs.Lookup(name)).env = env
}

// registerYes defines --yes, a flag only: skipping a confirmation must never come
// from a variable left in the shell.
func registerYes(fs *flag.FlagSet, p *bool, what string) {
	fs.BoolVar(p, "yes", false, "do not ask before "+what)
	flagOnly(fs, "yes")
}

var (
	streamIDPattern = regexp.MustCompile(`^[0-9]{1,20}(-[0-9]{1,20})?$`)
	// issueKeyish is a loose check; the lock's canonicalisation has the last word.
	issueKeyish = regexp.MustCompile(`^\S+$`)
)

func validateRangeID(p *problems, flagName, v string) {
	if v == "" || v == "-" || v == "+" || streamIDPattern.MatchString(strings.TrimPrefix(v, "(")) {
		return
	}
	p.addFlag(flagName, "= %q is not a stream id: MS or MS-SEQ (e.g. 1700000000000-0), - or +, or ( before an id for an exclusive bound", v)
}

func validateIssueFilter(p *problems, v string) {
	if v != "" && !issueKeyish.MatchString(strings.TrimSpace(v)) {
		p.addFlag("issue", "= %q is not an issue key: a project key, a dash and a number, e.g. RHEL-123", v)
	}
}

// validateAgentBranchFilter checks optional agent and branch filters.
func validateAgentBranchFilter(p *problems, agent, branch string) {
	if agent != "" && !oneOf(agent, Agents...) {
		p.addFlag("agent", "= %q is not an agent: one of %s", agent, strings.Join(Agents, "|"))
	}
	if branch != "" && !oneOf(branch, Branches...) {
		p.addFlag("branch", "= %q is not a branch: one of %s", branch, strings.Join(Branches, "|"))
	}
	if agent == "triage" && branch != "" {
		p.addFlag("branch", "= %q is not taken by agent triage, which reads every branch's issues", branch)
	}
}

// Pending is the settings of `ymirflow pending`.
type Pending struct {
	Inspect
	Agent  string // --agent (flag only): only this agent's groups (empty: every agent)
	Branch string // --branch (flag only): only this branch's groups (empty: every branch)
	Issue  string // --issue (flag only): only this issue's entries (the group summaries stay whole)
}

// Register defines pending's flags on fs.
func (c *Pending) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	fs.StringVar(&c.Agent, "agent", "", "only this agent's groups: "+strings.Join(Agents, "|")+" (empty: every agent)")
	fs.StringVar(&c.Branch, "branch", "", "only this branch's groups: "+strings.Join(Branches, "|")+" (empty: every branch)")
	fs.StringVar(&c.Issue, "issue", "", "only this issue's pending entries, e.g. RHEL-123")
	flagOnly(fs, "agent", "branch", "issue")
}

// Validate checks pending's settings.
func (c *Pending) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateAgentBranchFilter(&p, c.Agent, c.Branch)
	validateIssueFilter(&p, c.Issue)
	return p.err()
}

// Locks is the settings of `ymirflow locks` and `ymirflow locks release`.
type Locks struct {
	Inspect
	Agent string // --agent (flag only): only this agent's leases
	Issue string // --issue (flag only): only this issue's leases (direct lookups, no SCAN)
	Yes   bool   // --yes (flag only): release without asking
}

// Register defines locks' flags on fs.
func (c *Locks) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	fs.StringVar(&c.Agent, "agent", "", "only this agent's leases: "+strings.Join(Agents, "|")+" (empty: every agent)")
	fs.StringVar(&c.Issue, "issue", "", "only this issue's leases, looked up directly instead of scanning")
	registerYes(fs, &c.Yes, "force-releasing a lease (locks release)")
	flagOnly(fs, "agent", "issue")
}

// Validate checks locks' settings.
func (c *Locks) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateAgentBranchFilter(&p, c.Agent, "")
	validateIssueFilter(&p, c.Issue)
	return p.err()
}

// Replay is the settings of `ymirflow replay`.
type Replay struct {
	Inspect
	Stream string // --stream (flag only): input stream, e.g. triage, rebase:c9s, ymir:rebase:c9s:todo
	From   string // --from (flag only): first stream id (default -)
	To     string // --to (flag only): last stream id (default +: the last entry when the replay starts)
	Issue  string // --issue (flag only): only this issue's events
	DryRun bool   // --dry-run (flag only; DRY_RUN is the Jira setting): list what would be replayed
	Yes    bool   // --yes (flag only): replay a whole stream without asking
}

// Register defines replay's flags on fs.
func (c *Replay) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	fs.StringVar(&c.Stream, "stream", "", "input stream to replay, in full (ymir:rebase:c9s) or without the namespace (rebase:c9s, triage:todo)")
	fs.StringVar(&c.From, "from", "-", "first stream id of the range (inclusive; ( before it: exclusive)")
	fs.StringVar(&c.To, "to", "+", "last stream id of the range (inclusive; + is the last entry when the replay starts)")
	fs.StringVar(&c.Issue, "issue", "", "only this issue's events")
	fs.BoolVar(&c.DryRun, "dry-run", false, "list what would be replayed; publish nothing")
	registerYes(fs, &c.Yes, "replaying a whole stream (no --from, --to or --issue)")
	flagOnly(fs, "stream", "from", "to", "issue", "dry-run")
	required(fs, "stream", "")
}

// Validate checks replay's settings.
func (c *Replay) Validate() error {
	var p problems
	c.Common.validate(&p)
	if strings.TrimSpace(c.Stream) == "" {
		p.addFlag("stream", "is required: the input stream to replay, e.g. triage or rebase:c9s")
	}
	validateRangeID(&p, "from", c.From)
	validateRangeID(&p, "to", c.To)
	validateIssueFilter(&p, c.Issue)
	return p.err()
}

// DLQ is the settings of `ymirflow dlq`.
type DLQ struct {
	Inspect
	Issue  string // --issue (flag only): only this issue's dead letters (list, requeue --all)
	Before string // --before (flag only): only dead letters older than a stream id or a duration (list, purge)
	All    bool   // --all (flag only): requeue every dead letter (of --issue)
	Yes    bool   // --yes (flag only): purge without asking
}

// Register defines dlq's flags on fs.
func (c *DLQ) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	fs.StringVar(&c.Issue, "issue", "", "only this issue's dead letters (list, requeue --all)")
	fs.StringVar(&c.Before, "before", "", "only dead letters older than this: a stream id (1700000000000-0) or an age (72h) (list, purge)")
	fs.BoolVar(&c.All, "all", false, "requeue every dead letter (only --issue's with --issue)")
	registerYes(fs, &c.Yes, "purging dead letters")
	flagOnly(fs, "issue", "before", "all")
}

// BeforeID returns --before as a stream id: itself, or for an age the id of
// that long before now ("" when unset).
func (c *DLQ) BeforeID(now time.Time) string {
	if c.Before == "" || streamIDPattern.MatchString(c.Before) {
		return c.Before
	}
	d, err := time.ParseDuration(c.Before)
	if err != nil {
		return c.Before
	}
	return strconv.FormatInt(now.Add(-d).UnixMilli(), 10) + "-0"
}

// Validate checks dlq's settings.
func (c *DLQ) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateIssueFilter(&p, c.Issue)
	if c.Before != "" && !streamIDPattern.MatchString(c.Before) {
		if d, err := time.ParseDuration(c.Before); err != nil || d <= 0 {
			p.addFlag("before", "= %q is neither a stream id (1700000000000-0) nor a positive age (72h)", c.Before)
		}
	}
	return p.err()
}

// FakeJira is the settings of `ymirflow fakejira`.
type FakeJira struct {
	Addr       string // --addr, ADDR: listen address
	Issues     int    // --issues, ISSUES: generated sample issues (ignored with --issues-file)
	IssuesFile string // --issues-file, ISSUES_FILE: JSON array of issues as Jira's REST API returns them
	Seed       int64  // --seed, SEED: seed of the generated sample issues
	LogLevel   string // --log-level, LOG_LEVEL
	LogFormat  string // --log-format, LOG_FORMAT
	Webhook    string // --webhook, WEBHOOK: URLs that get a signed delivery on every label change and issue creation, comma-separated
	WebhookSecret
}

// Register defines fakejira's flags on fs.
func (f *FakeJira) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Addr, "addr", DefaultFakeJiraAddr, "listen address")
	fs.IntVar(&f.Issues, "issues", DefaultFakeJiraIssues, "generated sample issues (ignored with --issues-file)")
	fs.StringVar(&f.IssuesFile, "issues-file", "", "JSON array of issues shaped as Jira's REST API returns them")
	fs.Int64Var(&f.Seed, "seed", 1, "seed of the generated sample issues")
	fs.StringVar(&f.LogLevel, "log-level", DefaultLogLevel, "log level: "+strings.Join(LogLevels, "|"))
	fs.StringVar(&f.LogFormat, "log-format", DefaultLogFormat, "log format: json|console")
	fs.StringVar(&f.Webhook, "webhook", "", "URLs (comma-separated) that get a signed Jira webhook delivery on every label change and issue creation")
	f.WebhookSecret.register(fs, "secret the webhook deliveries are signed with (X-Hub-Signature)")
}

// Validate checks fakejira's settings.
func (f *FakeJira) Validate() error {
	var p problems
	if _, _, err := net.SplitHostPort(f.Addr); err != nil {
		p.add("addr", "= %q must be host:port or :port", f.Addr)
	}
	if f.Issues < 0 {
		p.add("issues", "= %d must not be negative", f.Issues)
	}
	if f.IssuesFile != "" {
		if _, err := os.Stat(f.IssuesFile); err != nil {
			p.add("issues-file", "= %q cannot be read: %v", f.IssuesFile, unwrapPathErr(err))
		}
	}
	if !oneOf(f.LogLevel, LogLevels...) {
		p.add("log-level", "= %q must be one of %s", f.LogLevel, strings.Join(LogLevels, "|"))
	}
	if !oneOf(f.LogFormat, "json", "console") {
		p.add("log-format", "= %q must be json or console", f.LogFormat)
	}
	f.validateWebhooks(&p)
	return p.err()
}

// Web is the settings of `ymirflow web`: the operator console.
type Web struct {
	Common
	Addr      string // --addr, WEB_ADDR: listen address (loopback by default)
	Token     string // --web-token, WEB_TOKEN: bearer token that write actions need (empty: read-only)
	TokenFile string // --web-token-file, WEB_TOKEN_FILE: file holding the token (read by WriteToken)
	ReadOnly  bool   // --read-only, WEB_READ_ONLY: refuse every write action even with a token
	// Refresh (--refresh, WEB_REFRESH) is how often pages refresh themselves;
	// ConsumerIdle (--consumer-idle, WEB_CONSUMER_IDLE) the idle time past which a
	// consumer is shown as not alive.
	Refresh      time.Duration
	ConsumerIdle time.Duration
}

// Register defines the console's flags on fs.
func (w *Web) Register(fs *flag.FlagSet) {
	w.Common.Register(fs)
	stringVarEnv(fs, &w.Addr, "addr", "WEB_ADDR", DefaultWebAddr, "listen address of the console; keep it on loopback or behind a NetworkPolicy")
	fs.StringVar(&w.Token, "web-token", "", "bearer token that write actions (requeue, purge, force release) need; empty: the console is read-only; prefer --web-token-file")
	fs.StringVar(&w.TokenFile, "web-token-file", "", "file that holds the bearer token, read once at start-up")
	boolVarEnv(fs, &w.ReadOnly, "read-only", "WEB_READ_ONLY", false, "refuse every write action, even with a token (the default when no token is set)")
	durationVarEnv(fs, &w.Refresh, "refresh", "WEB_REFRESH", DefaultWebRefresh, "how often pages refresh themselves")
	durationVarEnv(fs, &w.ConsumerIdle, "consumer-idle", "WEB_CONSUMER_IDLE", DefaultConsumerIdle, "a consumer idle for longer is shown as not alive")
}

// Validate checks the console's settings.
func (w *Web) Validate() error {
	var p problems
	w.Common.validate(&p)
	if _, _, err := net.SplitHostPort(w.Addr); err != nil {
		p.add("addr", "= %q must be host:port or :port", w.Addr)
	}
	if w.Token != "" && w.TokenFile != "" {
		p.add("web-token-file", "and WEB_TOKEN (--web-token) are both set; set one")
	}
	if w.TokenFile != "" {
		b, err := os.ReadFile(w.TokenFile)
		switch {
		case err != nil:
			p.add("web-token-file", "= %q cannot be read: %v", w.TokenFile, unwrapPathErr(err))
		case len(strings.TrimSpace(string(b))) < MinWebToken:
			p.add("web-token-file", "= %q holds fewer than %d characters", w.TokenFile, MinWebToken)
		}
	}
	if w.Token != "" && len(w.Token) < MinWebToken {
		p.add("web-token", "must have at least %d characters", MinWebToken)
	}
	if w.Refresh < 200*time.Millisecond {
		p.add("refresh", "= %s must be at least 200ms", fmtDur(w.Refresh))
	}
	if w.ConsumerIdle <= 0 {
		p.add("consumer-idle", "= %s must be positive", fmtDur(w.ConsumerIdle))
	}
	return p.err()
}

// MinWebToken is the shortest accepted console token: a guessable token is no
// protection.
const MinWebToken = 16

// WriteToken returns the token write actions need: Token, or the trimmed content of
// TokenFile, read now; "" when writes are off (no token, or ReadOnly).
func (w *Web) WriteToken() (string, error) {
	if w.ReadOnly {
		return "", nil
	}
	if w.Token != "" || w.TokenFile == "" {
		return w.Token, nil
	}
	b, err := os.ReadFile(w.TokenFile)
	if err != nil {
		return "", &SettingError{Env: "WEB_TOKEN_FILE", Flag: "web-token-file",
			Msg: fmt.Sprintf("= %q cannot be read: %v", w.TokenFile, unwrapPathErr(err))}
	}
	return strings.TrimSpace(string(b)), nil
}

// durationVarEnv defines a duration flag read from an environment variable whose
// name is not derived from the flag's.
func durationVarEnv(fs *flag.FlagSet, p *time.Duration, name, env string, value time.Duration, usage string) {
	fs.DurationVar(p, name, value, usage)
	settingOf(fs.Lookup(name)).env = env
}
