package config

import (
	"flag"
	"net"
	"time"
)

// Defaults of `ymirflow dev`.
const (
	DefaultDevRedisAddr    = "127.0.0.1:6380" // not 6379: a real Redis is often there
	DefaultDevInterval     = 30 * time.Second
	DefaultDevIssues       = 20
	DefaultDevDemoDuration = 2 * time.Second
	// DefaultDevTriageOnConflict is dev's triage workers' ON_CONFLICT when it is not
	// set: a maintainer's comment made during a run reaches the running agent (as in
	// the demo); any other busy event is dropped.
	DefaultDevTriageOnConflict = "comment.created=deliver,*=drop"
	// DefaultDevConcurrency is dev's workers' CONCURRENCY: a maintainer's comment is a
	// follow-up on the twin stream of its run's, read by a subscription of that stream;
	// with one per stream it waited behind the sample issues' runs until its own run
	// had ended, and skipped.
	DefaultDevConcurrency = 8
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
	// The busy-policy settings, passed to every worker dev starts, as the worker's.
	OnConflict   string // --on-conflict, ON_CONFLICT (empty: StageOnConflict's defaults)
	MailboxDepth int64  // --mailbox-depth, MAILBOX_DEPTH
	LockScope    string // --lock-scope, LOCK_SCOPE
	Concurrency  int    // --concurrency, CONCURRENCY: events each worker handles at once per input stream
}

// StageOnConflict is the ON_CONFLICT of dev's worker for agent: the one given, else
// DefaultDevTriageOnConflict on triage and the worker's default elsewhere.
func (d *Dev) StageOnConflict(agent string) string {
	switch {
	case d.OnConflict != "":
		return d.OnConflict
	case agent == "triage":
		return DefaultDevTriageOnConflict
	}
	return DefaultOnConflict
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
	fs.StringVar(&d.OnConflict, "on-conflict", "", "every worker's ON_CONFLICT: what happens to an event whose issue a run holds, per event type (see ymirflow worker --help); "+
		"unset: "+DefaultDevTriageOnConflict+" on triage (a maintainer's comment reaches the running agent), "+DefaultOnConflict+" on the other stages")
	fs.Int64Var(&d.MailboxDepth, "mailbox-depth", DefaultMailboxDepth, "every worker's MAILBOX_DEPTH: most follow-ups waiting in one lease's mailbox (deliver)")
	fs.IntVar(&d.Concurrency, "concurrency", DefaultDevConcurrency, "every worker's CONCURRENCY: events handled at once per input stream (a comment waits for a free one to reach its run)")
	fs.StringVar(&d.LockScope, "lock-scope", DefaultLockScope, "every worker's LOCK_SCOPE: what a run's lease guards: agent, issue, group:<paths> (see ymirflow worker --help)")
}

// busyFlags are the worker's settings that dev passes on: their problems are dev's.
var busyFlags = map[string]bool{"on-conflict": true, "mailbox-depth": true, "lock-scope": true, "concurrency": true}

// validateBusy checks the busy-policy settings with the worker's own checks, for the
// triage and the downstream workers (their ON_CONFLICT may differ), each problem once.
func (d *Dev) validateBusy(p *problems) {
	seen := map[string]bool{}
	for _, agent := range []string{"triage", "rebase"} {
		w := Worker{Agent: agent, Branch: "c9s", Runner: "demo", ConsumerName: "dev", OnConflict: d.StageOnConflict(agent),
			MailboxDepth: d.MailboxDepth, LockScope: d.LockScope, LockTTL: DefaultLockTTL, LockMaxHold: DefaultLockMaxHold,
			BlockTime: DefaultBlockTime, MaxIdleTime: DefaultMaxIdleTime, ClaimInterval: DefaultClaimInterval,
			MaxRetries: DefaultMaxRetries, Concurrency: d.Concurrency, ReadBatch: DefaultReadBatch, KillGrace: DefaultKillGrace}
		if agent == "triage" {
			w.Branch = ""
		}
		for _, se := range SettingErrors(w.Validate()) {
			if busyFlags[se.Flag] && !seen[se.Error()] {
				seen[se.Error()] = true
				*p = append(*p, se)
			}
		}
	}
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
	d.validateBusy(&p)
	w := Worker{RunnerEnv: d.RunnerEnv}
	if _, err := w.RunnerEnvPatterns(); err != nil {
		p.add("runner-env", "= %q: %v", d.RunnerEnv, err)
	}
	return p.err()
}
