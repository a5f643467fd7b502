package config

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
)

// clearEnv unsets every variable the binary reads (restored after the test), so
// that the caller's environment cannot leak into a test.
func clearEnv(t *testing.T) {
	t.Helper()
	for name := range EnvNames() {
		t.Setenv(name, "")
		if err := os.Unsetenv(name); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("EXEC", "")
	if err := os.Unsetenv("EXEC"); err != nil {
		t.Fatal(err)
	}
}

func load(t *testing.T, name string, c Command, args ...string) error {
	t.Helper()
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	c.Register(fs)
	if err := Parse(fs, args); err != nil {
		return err
	}
	return c.Validate()
}

func demoWorker(extra ...string) []string {
	return append([]string{"--agent", "triage", "--runner", "demo"}, extra...)
}

func TestDefaults(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if err := os.Unsetenv("KUBERNETES_SERVICE_HOST"); err != nil {
		t.Fatal(err)
	}
	var w Worker
	if err := load(t, "worker", &w, demoWorker()...); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	host += "-" + strconv.Itoa(os.Getpid()) // not in Kubernetes: hostname-pid
	want := Worker{
		Common: Common{RedisURL: "redis://127.0.0.1:6379/0", Namespace: "ymir", LogLevel: "info", LogFormat: "json", MaxLen: 100000, MaxEventBytes: 1 << 20},
		Jira:   Jira{JiraJQL: DefaultJQL, JiraTriggerGroup: "Red Hat Employee", JiraAPI: "auto", JiraTimeout: 90 * time.Second, JiraMaxRetries: 4, JiraRateLimit: 5},
		Agent:  "triage", Runner: "demo",
		LockTTL: 300 * time.Second, LockMaxHold: 6 * time.Hour, OnConflict: "drop", MailboxDepth: 100, LockScope: "agent",
		BlockTime: 5 * time.Second, MaxIdleTime: 3 * time.Minute, ClaimInterval: 5 * time.Second,
		MaxRetries: 3, Concurrency: 1, ReadBatch: 8, ConsumerName: host, MetricsAddr: "127.0.0.1:0", KillGrace: 10 * time.Second,
		RunRateBurst: 1,
	}
	w.fs = nil
	if w != want {
		t.Errorf("defaults:\n got %+v\nwant %+v", w, want)
	}
	if got := w.HeartbeatInterval(); got != 100*time.Second {
		t.Errorf("HeartbeatInterval = %v, want 100s", got)
	}
	if got := w.ShutdownBudget(); got != 16*time.Second {
		t.Errorf("ShutdownBudget = %v, want 16s", got)
	}
	if w.MaxIdleTime <= w.HeartbeatInterval() {
		t.Errorf("default MAX_IDLE_TIME %v does not exceed the default heartbeat %v", w.MaxIdleTime, w.HeartbeatInterval())
	}

	var f Fetch
	if err := load(t, "fetch", &f, "--jira-url", "http://jira.example"); err != nil {
		t.Fatal(err)
	}
	if f.APIFlavour() != "" {
		t.Errorf("APIFlavour() for auto = %q, want empty", f.APIFlavour())
	}
	if f.Once || f.Interval != 5*time.Minute || f.MaxIssues != 0 || f.StaleLabelThreshold != 24*time.Hour || f.DryRun {
		t.Errorf("fetch defaults: %+v", f)
	}
	var d Demo
	if err := load(t, "demo", &d); err != nil {
		t.Fatal(err)
	}
	if d.RedisURL != "" {
		t.Errorf("demo REDIS_URL default = %q, want empty (embedded Redis)", d.RedisURL)
	}
}

func TestEnvUsedWhenFlagAbsent(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	t.Setenv("REDIS_URL", "rediss://user:pw@redis.example:6380/2")
	t.Setenv("YMIR_NAMESPACE", "staging")
	t.Setenv("LOCK_TTL", "100s")
	t.Setenv("MAX_IDLE_TIME", "45s")
	t.Setenv("BLOCK_TIME", "200ms")
	t.Setenv("CONCURRENCY", "4")
	t.Setenv("DRY_RUN", "true")
	t.Setenv("MAX_LEN", "5000")
	t.Setenv("CONSUMER_NAME", "pod-7")
	t.Setenv("ON_CONFLICT", "coalesce")
	t.Setenv("AGENT", "backport")
	t.Setenv("BRANCH", "c10s")
	var w Worker
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	w.Register(fs)
	if err := Parse(fs, []string{"--runner", "demo"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	if w.RedisURL != "rediss://user:pw@redis.example:6380/2" || w.Namespace != "staging" ||
		w.LockTTL != 100*time.Second || w.MaxIdleTime != 45*time.Second || w.BlockTime != 200*time.Millisecond ||
		w.Concurrency != 4 || !w.DryRun || w.MaxLen != 5000 || w.ConsumerName != "pod-7" ||
		w.OnConflict != "coalesce" || w.Agent != "backport" || w.Branch != "c10s" {
		t.Errorf("env not applied: %+v", w)
	}
	// A flag set from the environment counts as set (fs.Visit sees it).
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"lock-ttl", "dry-run", "runner", "consumer-name"} {
		if !set[name] {
			t.Errorf("flag %s not marked as set", name)
		}
	}
	if set["kill-grace"] {
		t.Error("kill-grace marked as set although neither flag nor env gave it")
	}
}

func TestFlagWinsOverEnv(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	t.Setenv("LOCK_TTL", "10m")
	t.Setenv("DRY_RUN", "true")
	t.Setenv("YMIR_NAMESPACE", "from-env")
	t.Setenv("CONCURRENCY", "not-a-number") // never read: the flag wins
	var w Worker
	err := load(t, "worker", &w, demoWorker("--lock-ttl", "90s", "--kill-grace", "5s", "--dry-run=false",
		"--ymir-namespace", "from-flag", "--concurrency", "3", "--max-idle-time", "31s")...)
	if err != nil {
		t.Fatal(err)
	}
	if w.LockTTL != 90*time.Second || w.DryRun || w.Namespace != "from-flag" || w.Concurrency != 3 {
		t.Errorf("flag did not win: ttl=%v dry=%v ns=%q conc=%d", w.LockTTL, w.DryRun, w.Namespace, w.Concurrency)
	}
}

func TestRunnerExecEnv(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	t.Setenv("RUNNER_EXEC", "agent --from-env")
	t.Setenv("EXEC", "never read")
	var w Worker
	if err := load(t, "worker", &w, "--agent", "triage"); err != nil {
		t.Fatal(err)
	}
	if w.Runner != "exec" || w.Exec != "agent --from-env" {
		t.Errorf("RUNNER_EXEC not applied: runner=%q exec=%q", w.Runner, w.Exec)
	}
	var w2 Worker
	if err := load(t, "worker", &w2, "--agent", "triage", "--exec", "agent --from-flag"); err != nil {
		t.Fatal(err)
	}
	if w2.Exec != "agent --from-flag" {
		t.Errorf("--exec did not win over RUNNER_EXEC: %q", w2.Exec)
	}

	t.Setenv("RUNNER_EXEC", "")
	var w3 Worker
	err := load(t, "worker", &w3, "--agent", "triage")
	if !hasSetting(err, "RUNNER_EXEC", "exec") {
		t.Fatalf("EXEC must not stand for RUNNER_EXEC; got %v", err)
	}
	if !strings.Contains(err.Error(), "RUNNER_EXEC (--exec) is required when RUNNER (--runner) is exec") {
		t.Errorf("message: %v", err)
	}

	names := EnvNames()
	if got := strings.Join(names["RUNNER_EXEC"], ","); got != "dev,worker" {
		t.Errorf("EnvNames()[RUNNER_EXEC] = %v, want dev,worker", got)
	}
	if _, ok := names["EXEC"]; ok {
		t.Error("EnvNames lists EXEC")
	}
}

func TestDurationParsing(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{{"300s", 300 * time.Second}, {"5m", 5 * time.Minute}, {"200ms", 200 * time.Millisecond}, {"1h30m", 90 * time.Minute}} {
		clearEnv(t)
		var w Worker
		if err := load(t, "worker", &w, demoWorker("--lock-ttl", "100ms", "--kill-grace", "10ms", "--lock-max-hold", tc.in)...); err != nil {
			t.Fatalf("flag %s: %v", tc.in, err)
		}
		if w.LockMaxHold != tc.want {
			t.Errorf("flag %s = %v, want %v", tc.in, w.LockMaxHold, tc.want)
		}
		t.Setenv("LOCK_MAX_HOLD", tc.in)
		var w2 Worker
		if err := load(t, "worker", &w2, demoWorker()...); err != nil {
			t.Fatalf("env %s: %v", tc.in, err)
		}
		if w2.LockMaxHold != tc.want {
			t.Errorf("env %s = %v, want %v", tc.in, w2.LockMaxHold, tc.want)
		}
	}

	clearEnv(t)
	t.Setenv("LOCK_TTL", "5 minutes")
	var w Worker
	err := load(t, "worker", &w, demoWorker()...)
	var se *SettingError
	if !errors.As(err, &se) || se.Env != "LOCK_TTL" || se.Flag != "lock-ttl" {
		t.Fatalf("bad LOCK_TTL: got %v, want a SettingError naming LOCK_TTL and lock-ttl", err)
	}
	if !strings.Contains(err.Error(), `LOCK_TTL (--lock-ttl) = "5 minutes"`) {
		t.Errorf("message: %v", err)
	}

	clearEnv(t)
	t.Setenv("CONCURRENCY", "many")
	err = load(t, "worker", &Worker{}, demoWorker()...)
	if !errors.As(err, &se) || se.Env != "CONCURRENCY" {
		t.Errorf("bad CONCURRENCY: %v", err)
	}

	clearEnv(t)
	err = load(t, "worker", &Worker{}, demoWorker("--lock-ttl", "soon")...)
	if err == nil || !strings.Contains(err.Error(), "lock-ttl") {
		t.Errorf("bad --lock-ttl: %v", err)
	}
}

func hasSetting(err error, env, flagName string) bool {
	for _, se := range SettingErrors(err) {
		if se.Env == env && se.Flag == flagName {
			return strings.Contains(se.Error(), env) && strings.Contains(se.Error(), "--"+flagName)
		}
	}
	return false
}

func TestValidationNamesTheSetting(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	okTok := filepath.Join(dir, "token")
	if err := os.WriteFile(okTok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	type tc struct {
		name    string
		cmd     string
		args    []string
		env     map[string]string
		wantEnv string
		wantFlg string
		want    string // substring of the message
	}
	w := func(args ...string) []string { return demoWorker(args...) }
	cases := []tc{
		{"zero ttl", "worker", w("--lock-ttl", "0s"), nil, "LOCK_TTL", "lock-ttl", "must be positive"},
		{"negative ttl", "worker", w("--lock-ttl", "-5s"), nil, "LOCK_TTL", "lock-ttl", "= -5s must be positive"},
		{"negative ttl env", "worker", w(), map[string]string{"LOCK_TTL": "-1m"}, "LOCK_TTL", "lock-ttl", "must be positive"},
		{"tiny ttl", "worker", w("--lock-ttl", "1ms"), nil, "LOCK_TTL", "lock-ttl", "= 1ms must be from 30ms to 24h"},
		{"huge ttl", "worker", w("--lock-ttl", "25h"), nil, "LOCK_TTL", "lock-ttl", "= 25h must be from 30ms to 24h"},
		{"idle below heartbeat", "worker", w("--lock-ttl", "5m", "--max-idle-time", "1m"), nil, "MAX_IDLE_TIME", "max-idle-time",
			"MAX_IDLE_TIME (--max-idle-time) = 1m must exceed the lease heartbeat interval LOCK_TTL/3 = 1m40s; LOCK_TTL (--lock-ttl) is 5m"},
		{"idle below heartbeat env", "worker", w(), map[string]string{"LOCK_TTL": "5m", "MAX_IDLE_TIME": "1m"}, "MAX_IDLE_TIME", "max-idle-time",
			"LOCK_TTL (--lock-ttl) is 5m"},
		{"idle equal heartbeat", "worker", w("--lock-ttl", "3m", "--max-idle-time", "1m"), nil, "MAX_IDLE_TIME", "max-idle-time", "LOCK_TTL/3 = 1m"},
		{"max hold", "worker", w("--lock-max-hold", "1m", "--lock-ttl", "5m"), nil, "LOCK_MAX_HOLD", "lock-max-hold", "= 1m must be at least LOCK_TTL = 5m; LOCK_TTL (--lock-ttl) is 5m"},
		// KILL_GRACE raises the derived LOCK_TTL, MAX_IDLE_TIME lowers it: given together
		// they can contradict each other, and the message says LOCK_TTL was derived.
		{"grace against idle", "worker", w("--kill-grace", "1m", "--max-idle-time", "1m"), nil, "KILL_GRACE", "kill-grace",
			"= 1m must not exceed LOCK_TTL/10 = 12s (the lease's safety margin); LOCK_TTL (--lock-ttl) is not set and was derived as 2m"},
		{"max hold zero", "worker", w("--lock-max-hold", "0s"), nil, "LOCK_MAX_HOLD", "lock-max-hold", "must be positive"},
		{"no agent", "worker", []string{"--runner", "demo"}, nil, "AGENT", "agent", "is required"},
		{"unknown agent", "worker", []string{"--runner", "demo", "--agent", "reproducer"}, nil, "AGENT", "agent", `"reproducer" is not an agent`},
		{"missing branch", "worker", []string{"--runner", "demo", "--agent", "rebase"}, nil, "BRANCH", "branch", "is required for agent rebase"},
		{"bad branch", "worker", []string{"--runner", "demo", "--agent", "rebuild", "--branch", "c8s"}, nil, "BRANCH", "branch", `"c8s" is not a branch`},
		{"branch for triage", "worker", w("--branch", "c9s"), nil, "BRANCH", "branch", "not taken by agent triage"},
		{"exec without command", "worker", []string{"--agent", "triage"}, nil, "RUNNER_EXEC", "exec", "required when RUNNER (--runner) is exec"},
		{"blank exec", "worker", []string{"--agent", "triage", "--exec", "  "}, nil, "RUNNER_EXEC", "exec", "required"},
		{"bad runner", "worker", []string{"--agent", "triage", "--runner", "ssh"}, nil, "RUNNER", "runner", "exec or demo"},
		{"on conflict", "worker", w("--on-conflict", "queue"), nil, "ON_CONFLICT", "on-conflict", `policy must be "drop", "coalesce", "deliver", "supersede" or "wait", got "queue", or delay:D[:MAX]`},
		{"on conflict supersede typo", "worker", w("--on-conflict", "rebase.requested=supercede"), nil, "ON_CONFLICT", "on-conflict", `got "supercede"`},
		{"supersede with a shared scope", "worker", w("--on-conflict", "triage.requested=supersede,*=drop", "--lock-scope", "agent,issue"), nil, "LOCK_SCOPE", "lock-scope", "cannot follow with supersede"},
		{"supersede with a group scope", "worker", w(), map[string]string{"ON_CONFLICT": "supersede", "LOCK_SCOPE": "group:m:lock_key"}, "LOCK_SCOPE", "lock-scope", "cannot follow with supersede"},
		{"wait with two shared scopes", "worker", w("--on-conflict", "wait:10", "--lock-scope", "agent,issue,group:m:lock_key"), nil, "LOCK_SCOPE", "lock-scope", "cannot follow with wait"},
		{"wait beside coalesce", "worker", w("--on-conflict", "rebase.requested=wait,*=coalesce"), nil, "ON_CONFLICT", "on-conflict", "wait can be combined with drop and delay only"},
		{"wait with a bad MAX", "worker", w("--on-conflict", "wait:0"), nil, "ON_CONFLICT", "on-conflict", "wait MAX"},
		{"on conflict table", "worker", w("--on-conflict", "rebase.requested=drop,*=delay:1s,rebase.requested=coalesce"), nil, "ON_CONFLICT", "on-conflict", "rebase.requested given twice"},
		{"on conflict delay", "worker", w("--on-conflict", "*=delay:0s"), nil, "ON_CONFLICT", "on-conflict", "must be from 10ms to 24h0m0s"},
		{"on conflict delay cap", "worker", w("--on-conflict", "delay:2m:1m"), nil, "ON_CONFLICT", "on-conflict", "delay cap 1m0s must be from the delay 2m0s"},
		{"on conflict type", "worker", w("--on-conflict", "Rebase=drop"), nil, "ON_CONFLICT", "on-conflict", `"Rebase" is not an event type`},
		// A type no worker runs (a typo) would leave the type meant to the default rule.
		{"on conflict unknown type", "worker", w("--on-conflict", "bogus.event=drop"), nil, "ON_CONFLICT", "on-conflict",
			`"bogus.event=drop": bogus.event is not an event type a worker runs: one of triage.requested, rebase.requested, backport.requested, rebuild.requested, comment.created`},
		{"on conflict comment typo", "worker", w(), map[string]string{"ON_CONFLICT": "comment.create=deliver,*=drop"}, "ON_CONFLICT", "on-conflict",
			"comment.create is not an event type a worker runs"},
		{"lock wait replicas", "worker", w("--lock-wait-replicas", "-1"), nil, "LOCK_WAIT_REPLICAS", "lock-wait-replicas", "between 0 and 16"},
		{"lock wait aof alone", "worker", w(), map[string]string{"LOCK_WAIT_AOF": "true"}, "LOCK_WAIT_AOF", "lock-wait-aof", "LOCK_WAIT_REPLICAS (--lock-wait-replicas) is 0"},
		{"mailbox depth", "worker", w("--mailbox-depth", "0"), nil, "MAILBOX_DEPTH", "mailbox-depth", "between 1 and 100000"},
		{"deliver with a shared scope", "worker", w("--on-conflict", "deliver", "--lock-scope", "agent,issue"), nil, "LOCK_SCOPE", "lock-scope", "cannot follow with coalesce or deliver"},
		{"lock scope", "worker", w("--lock-scope", "issues"), nil, "LOCK_SCOPE", "lock-scope", `"issues" is not agent, issue or group`},
		{"lock scope path", "worker", w(), map[string]string{"LOCK_SCOPE": "group:metadata..component"}, "LOCK_SCOPE", "lock-scope", "field path"},
		{"lock scope group empty", "worker", w("--lock-scope", "issue,group:"), nil, "LOCK_SCOPE", "lock-scope", "needs field paths"},
		{"lock scope coalesce", "worker", w("--lock-scope", "issue", "--on-conflict", "coalesce"), nil, "LOCK_SCOPE", "lock-scope", "cannot follow with coalesce"},
		{"lock scope coalesce table", "worker", w("--lock-scope", "issue", "--on-conflict", "triage.requested=coalesce,*=drop"), nil, "LOCK_SCOPE", "lock-scope", "cannot follow with coalesce"},
		{"block time", "worker", w("--block-time", "0s"), nil, "BLOCK_TIME", "block-time", "must be positive"},
		{"claim interval", "worker", w("--claim-interval", "-1s"), nil, "CLAIM_INTERVAL", "claim-interval", "must be positive"},
		{"max retries", "worker", w("--max-retries", "0"), nil, "MAX_RETRIES", "max-retries", "at least 1"},
		{"concurrency", "worker", w("--concurrency", "0"), nil, "CONCURRENCY", "concurrency", "between 1 and"},
		{"read batch zero", "worker", w("--read-batch", "0"), nil, "READ_BATCH", "read-batch", "between 1 and 100"},
		{"read batch big", "worker", w("--read-batch", "1000"), nil, "READ_BATCH", "read-batch", "between 1 and 100"},
		{"consumer name", "worker", w("--consumer-name", "a b"), nil, "CONSUMER_NAME", "consumer-name", "spaces"},
		{"consumer name empty", "worker", w("--consumer-name", ""), nil, "CONSUMER_NAME", "consumer-name", "required"},
		{"metrics addr", "worker", w("--metrics-addr", "9090"), nil, "METRICS_ADDR", "metrics-addr", "host:port"},
		{"metrics port", "worker", w("--metrics-addr", ":99999"), nil, "METRICS_ADDR", "metrics-addr", "invalid port"},
		{"kill grace", "worker", w("--kill-grace", "0s"), nil, "KILL_GRACE", "kill-grace", "must be positive"},
		{"redis scheme", "worker", w("--redis-url", "http://x:6379"), nil, "REDIS_URL", "redis-url", "must start with redis://"},
		{"redis host", "worker", w("--redis-url", "redis:///0"), nil, "REDIS_URL", "redis-url", "no host"},
		{"redis sentinel master", "worker", w("--redis-url", "redis+sentinel://s1:26379"), nil, "REDIS_URL", "redis-url", "no master name"},
		{"redis db", "worker", w("--redis-url", "redis://h:6379/zero"), nil, "REDIS_URL", "redis-url", "database"},
		{"redis empty", "fetch", []string{"--jira-url", "http://j", "--redis-url", ""}, nil, "REDIS_URL", "redis-url", "is required"},
		{"namespace empty", "worker", w("--ymir-namespace", ""), nil, "YMIR_NAMESPACE", "ymir-namespace", "is required"},
		{"namespace glob", "pending", []string{"--ymir-namespace", "ymir*"}, nil, "YMIR_NAMESPACE", "ymir-namespace", "glob"},
		{"log level", "worker", w(), map[string]string{"LOG_LEVEL": "verbose"}, "LOG_LEVEL", "log-level", `"verbose" must be one of`},
		{"log format", "streams", []string{"--log-format", "text"}, nil, "LOG_FORMAT", "log-format", "json or console"},
		{"max len", "enqueue", []string{"--max-len", "-1"}, nil, "MAX_LEN", "max-len", "must not be negative"},
		{"jira url", "worker", w("--jira-url", "ftp://jira"), nil, "JIRA_URL", "jira-url", "http:// or https://"},
		{"jira api", "worker", w("--jira-api", "v2"), nil, "JIRA_API", "jira-api", "cloud, server or auto"},
		{"jira timeout", "worker", w("--jira-timeout", "0s"), nil, "JIRA_TIMEOUT", "jira-timeout", "must be positive"},
		{"jira rate", "worker", w(), map[string]string{"JIRA_RATE_LIMIT": "0"}, "JIRA_RATE_LIMIT", "jira-rate-limit", "block every request"},
		{"jira rate nan", "worker", w("--jira-rate-limit", "NaN"), nil, "JIRA_RATE_LIMIT", "jira-rate-limit", "finite"},
		{"shared jira rate 0", "fetch", []string{"--jira-url", "http://j"}, map[string]string{"JIRA_RATE": "0/s"}, "JIRA_RATE", "jira-rate", "at least 1"},
		{"shared jira rate negative", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature", "--jira-rate", "-5/s"}, nil, "JIRA_RATE", "jira-rate", "at least 1"},
		{"shared jira rate unparsable", "worker", w("--jira-rate", "fast"), nil, "JIRA_RATE", "jira-rate", "not N/UNIT"},
		{"shared jira rate unit", "worker", w("--jira-rate", "5/week"), nil, "JIRA_RATE", "jira-rate", "not s, m, h"},
		{"shared jira burst", "worker", w("--jira-rate", "5/s", "--jira-rate-burst", "-1"), nil, "JIRA_RATE_BURST", "jira-rate-burst", "negative"},
		{"run rate 0", "worker", w("--run-rate", "0/h"), nil, "RUN_RATE", "run-rate", "at least 1"},
		{"run rate negative", "worker", w(), map[string]string{"RUN_RATE": "-30/h"}, "RUN_RATE", "run-rate", "at least 1"},
		{"run rate unparsable", "worker", w("--run-rate", "30 per hour"), nil, "RUN_RATE", "run-rate", "not N/UNIT"},
		{"run rate burst 0", "worker", w("--run-rate", "30/h", "--run-rate-burst", "0"), nil, "RUN_RATE_BURST", "run-rate-burst", "at least 1"},
		{"jira url credentials", "worker", w("--jira-url", "https://bob:s3cret@jira.example.com"), nil, "JIRA_URL", "jira-url", "must not carry credentials"},
		{"jira url query", "fetch", []string{"--jira-url", "https://jira.example.com/?x=1"}, nil, "JIRA_URL", "jira-url", "query or fragment"},
		{"token and file", "worker", w("--jira-token", "t", "--jira-token-file", okTok), nil, "JIRA_TOKEN_FILE", "jira-token-file", "both set"},
		{"token file missing", "worker", w("--jira-token-file", missing), nil, "JIRA_TOKEN_FILE", "jira-token-file", "cannot be read"},
		{"token file empty", "worker", w("--jira-token-file", empty), nil, "JIRA_TOKEN_FILE", "jira-token-file", "is empty"},
		{"email without token", "worker", w("--jira-email", "a@b"), nil, "JIRA_EMAIL", "jira-email", "neither JIRA_TOKEN"},
		{"cloud without email", "worker", w("--jira-api", "cloud", "--jira-token", "t"), nil, "JIRA_EMAIL", "jira-email", "JIRA_API=cloud"},
		{"fetch without jira", "fetch", nil, nil, "JIRA_URL", "jira-url", "fetcher searches Jira"},
		{"fetch jql", "fetch", []string{"--jira-url", "http://j", "--jira-jql", " "}, nil, "JIRA_JQL", "jira-jql", "is required"},
		{"fetch interval", "fetch", []string{"--jira-url", "http://j", "--interval", "0s"}, nil, "INTERVAL", "interval", "ONCE (--once)"},
		{"fetch max issues", "fetch", []string{"--jira-url", "http://j", "--max-issues", "-1"}, nil, "MAX_ISSUES", "max-issues", "negative"},
		{"fetch stale", "fetch", []string{"--jira-url", "http://j"}, map[string]string{"STALE_LABEL_THRESHOLD": "0s"}, "STALE_LABEL_THRESHOLD", "stale-label-threshold", "positive"},
		{"demo issues", "demo", []string{"--issues", "0"}, nil, "ISSUES", "issues", "at least 1"},
		{"enqueue branch", "enqueue", []string{"--agent", "backport"}, nil, "", "branch", "required for agent backport"},
		{"enqueue agent", "enqueue", []string{"--agent", "nope"}, nil, "", "agent", "not an agent"},
		{"fakejira addr", "fakejira", []string{"--addr", "8080"}, nil, "ADDR", "addr", "host:port"},
		{"fakejira file", "fakejira", []string{"--issues-file", missing}, nil, "ISSUES_FILE", "issues-file", "cannot be read"},
		{"fakejira issues", "fakejira", []string{"--issues", "-3"}, nil, "ISSUES", "issues", "negative"},
		{"fakejira webhook", "fakejira", []string{"--webhook", "ftp://x"}, nil, "WEBHOOK", "webhook", "http:// or https://"},
		{"fakejira webhook secret", "fakejira", []string{"--webhook-secret", "a", "--webhook-secret-file", okTok}, nil, "WEBHOOK_SECRET_FILE", "webhook-secret-file", "both set"},
		{"webhook no secret", "webhook", []string{"--jira-url", "http://j"}, nil, "WEBHOOK_SECRET", "webhook-secret", "INSECURE_NO_SIGNATURE"},
		{"webhook no jira", "webhook", []string{"--webhook-secret", "s"}, nil, "JIRA_URL", "jira-url", "is required"},
		{"webhook secret file", "webhook", []string{"--jira-url", "http://j", "--webhook-secret-file", empty}, nil, "WEBHOOK_SECRET_FILE", "webhook-secret-file", "is empty"},
		{"webhook deadline", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature"}, map[string]string{"WEBHOOK_DEADLINE": "30s"}, "WEBHOOK_DEADLINE", "webhook-deadline", "at most 10s"},
		{"webhook body", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature", "--webhook-max-body", "0"}, nil, "WEBHOOK_MAX_BODY", "webhook-max-body", "positive"},
		{"webhook comment bound", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature"}, map[string]string{"WEBHOOK_COMMENT_MAX_BYTES": "10"}, "WEBHOOK_COMMENT_MAX_BYTES", "webhook-comment-max-bytes", "at least 64"},
		{"webhook approval amount", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature"}, map[string]string{"WEBHOOK_APPROVAL_USD": "-1"}, "WEBHOOK_APPROVAL_USD", "webhook-approval-usd", "0 (off) to 10000 USD"},
		{"webhook scope", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature", "--jira-jql", ""}, nil, "JIRA_JQL", "jira-jql", "WEBHOOK_CHECK_SCOPE"},
		{"webhook jql unscoped", "webhook", []string{"--jira-url", "http://j", "--insecure-no-signature", "--webhook-check-scope=false", "--jira-jql", ""}, nil, "JIRA_JQL", "jira-jql", "is required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cmd := Commands()[c.cmd]
			err := load(t, c.cmd, cmd, c.args...)
			if err == nil {
				t.Fatalf("no error")
			}
			if !hasSetting(err, c.wantEnv, c.wantFlg) {
				t.Fatalf("error does not name %s (--%s): %v", c.wantEnv, c.wantFlg, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
			for _, se := range SettingErrors(err) {
				if se.Env != "" && !strings.Contains(se.Error(), se.Env+" (--"+se.Flag+")") {
					t.Errorf("error %q does not start with its setting", se)
				}
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	err := load(t, "worker", &Worker{}, "--agent", "rebase", "--lock-ttl", "-1s", "--on-conflict", "x", "--concurrency", "0")
	got := map[string]bool{}
	for _, se := range SettingErrors(err) {
		got[se.Env] = true
	}
	for _, want := range []string{"BRANCH", "RUNNER_EXEC", "LOCK_TTL", "ON_CONFLICT", "CONCURRENCY"} {
		if !got[want] {
			t.Errorf("missing %s in %v", want, err)
		}
	}
	if got["MAX_IDLE_TIME"] || got["LOCK_MAX_HOLD"] {
		t.Errorf("a bad LOCK_TTL must not also blame the settings compared with it: %v", err)
	}
}

func TestRedisPasswordNotInErrors(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	err := load(t, "worker", &Worker{}, demoWorker("--redis-url", "http://user:hunter2@h:1/0")...)
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error leaks the password or is missing: %v", err)
	}
	if got := redact.URL("redis://:hunter2@valkey:6379/0"); strings.Contains(got, "hunter2") || !strings.Contains(got, "valkey:6379") {
		t.Errorf("redact.URL = %q", got)
	}
	c := Common{RedisURL: "rediss://ymir:pw@r:6380/1"}
	if got := c.RedactedRedisURL(); strings.Contains(got, ":pw@") {
		t.Errorf("RedactedRedisURL = %q", got)
	}
}

func TestJiraToken(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(f, []byte("  abc123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	j := Jira{JiraTokenFile: f}
	if tok, err := j.Token(); err != nil || tok != "abc123" {
		t.Errorf("Token() = %q, %v", tok, err)
	}
	if err := os.WriteFile(f, []byte("rotated"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, _ := j.Token(); tok != "rotated" {
		t.Errorf("Token() after rotation = %q", tok)
	}
	j = Jira{JiraToken: "direct"}
	if tok, _ := j.Token(); tok != "direct" {
		t.Errorf("Token() = %q", tok)
	}
	j = Jira{JiraTokenFile: f + ".gone"}
	if _, err := j.Token(); !hasSetting(err, "JIRA_TOKEN_FILE", "jira-token-file") {
		t.Errorf("missing file: %v", err)
	}
}

func TestEnvNames(t *testing.T) {
	t.Parallel()
	names := EnvNames()
	// Every variable the commands document, plus the runner's.
	for _, want := range []string{"REDIS_URL", "YMIR_NAMESPACE", "LOCK_TTL", "LOCK_MAX_HOLD", "ON_CONFLICT",
		"BLOCK_TIME", "MAX_IDLE_TIME", "CLAIM_INTERVAL", "MAX_RETRIES", "CONCURRENCY", "READ_BATCH", "CONSUMER_NAME",
		"METRICS_ADDR", "LOG_LEVEL", "LOG_FORMAT", "JIRA_URL", "JIRA_EMAIL", "JIRA_TOKEN", "JIRA_TOKEN_FILE",
		"JIRA_JQL", "JIRA_TRIGGER_GROUP", "MAX_ISSUES", "STALE_LABEL_THRESHOLD", "DRY_RUN", "RUNNER",
		"RUNNER_EXEC", "KILL_GRACE", "MAX_LEN", "AGENT", "BRANCH", "ONCE", "INTERVAL", "JIRA_API", "LOCK_SCOPE"} {
		if len(names[want]) == 0 {
			t.Errorf("EnvNames lacks %s", want)
		}
	}
	if got := strings.Join(names["LOCK_TTL"], ","); got != "worker" {
		t.Errorf("LOCK_TTL read by %s, want worker", got)
	}
	if got := strings.Join(names["REDIS_URL"], ","); got != "audit,budget,cost,demo,dev,dlq,drain,enqueue,fetch,history,locks,pause,pending,replay,resume,streams,web,webhook,worker" {
		t.Errorf("REDIS_URL read by %s", got)
	}
	if got := strings.Join(names["JIRA_JQL"], ","); got != "dev,fetch,webhook,worker" {
		t.Errorf("JIRA_JQL read by %s", got)
	}
	// Within one command no two flags share a variable, and EnvNamesOf agrees.
	for cmd := range Commands() {
		of := EnvNamesOf(cmd)
		if !sort.StringsAreSorted(of) {
			t.Errorf("%s: EnvNamesOf not sorted", cmd)
		}
		for i := 1; i < len(of); i++ {
			if of[i] == of[i-1] {
				t.Errorf("%s: two flags read %s", cmd, of[i])
			}
		}
		for _, e := range of {
			found := false
			for _, c := range names[e] {
				found = found || c == cmd
			}
			if !found {
				t.Errorf("EnvNames()[%s] lacks %s", e, cmd)
			}
		}
	}
	if EnvNamesOf("nope") != nil {
		t.Error("EnvNamesOf(unknown) != nil")
	}
}

func TestUsage(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	var buf bytes.Buffer
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(&buf)
	var w Worker
	w.Register(fs)
	fs.Usage = Usage(fs)
	err := Parse(fs, []string{"--help"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	out := buf.String()
	for _, want := range []string{
		"Usage of worker:",
		"--lock-ttl duration", "(default 5m)", "$LOCK_TTL",
		"--exec string", "$RUNNER_EXEC",
		"--lock-max-hold duration", "(default 6h)",
		"--redis-url string", `(default "redis://127.0.0.1:6379/0")`, "$REDIS_URL",
		"--ymir-namespace string", "$YMIR_NAMESPACE",
		"--dry-run", "$DRY_RUN",
		"--max-len int", "(default 100000)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "$EXEC") {
		t.Error("usage names $EXEC")
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if !strings.Contains(line, "$") {
			t.Errorf("usage line without an environment variable: %q", line)
		}
	}
}

func TestLoad(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	var e Enqueue
	fs, err := Load("enqueue", &e, []string{"--agent", "rebase", "--branch", "c9s", "--user-triggered", "rhel-1", "RHEL-2"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Agent != "rebase" || e.Branch != "c9s" || !e.UserTriggered {
		t.Errorf("enqueue: %+v", e)
	}
	if got := strings.Join(fs.Args(), " "); got != "rhel-1 RHEL-2" {
		t.Errorf("args = %q", got)
	}
	if _, err := Load("enqueue", &Enqueue{}, []string{"--agent", "rebase"}); !hasSetting(err, "", "branch") {
		t.Errorf("Load does not validate: %v", err)
	}
}

func TestFmtDur(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Minute: "1m", 100 * time.Second: "1m40s", 6 * time.Hour: "6h", 10 * time.Second: "10s",
		90 * time.Minute: "1h30m", 10 * time.Minute: "10m", 200 * time.Millisecond: "200ms", 0: "0s", -5 * time.Second: "-5s",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}

// A runner that ignores SIGTERM must be dead before the lease's key can expire.
func TestKillGraceWithinLeaseMargin(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	var w Worker
	err := load(t, "worker", &w, demoWorker("--lock-ttl", "60s", "--kill-grace", "7s")...)
	if err == nil || !strings.Contains(err.Error(), "KILL_GRACE (--kill-grace) = 7s must not exceed LOCK_TTL/10 = 6s") {
		t.Fatalf("err = %v", err)
	}
}

func TestRunnerEnvAndEventBounds(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	for _, tc := range []struct {
		args []string
		want string // "" valid, else in the error
	}{
		{[]string{"--runner-env", "GITLAB_TOKEN, ANTHROPIC_*,JIRA_TOKEN"}, ""},
		{[]string{"--runner-env", "*"}, "RUNNER_ENV"},
		{[]string{"--runner-env", "REDIS_URL"}, "never passed"},
		{[]string{"--runner-env", "BAD-NAME"}, "neither a variable name"},
		{[]string{"--max-event-bytes", "100"}, "MAX_EVENT_BYTES"},
		{[]string{"--redis-url", "unix:///run/redis.sock"}, "unix sockets are not supported"},
	} {
		var w Worker
		err := load(t, "worker", &w, append(demoWorker(), tc.args...)...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}

// Issue 29: CONSUMER_NAME unset is unique per process outside Kubernetes (two workers on
// one machine are two consumers) and the pod's name inside (stable across a container's
// restarts).
func TestDefaultConsumerName(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	host, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if err := os.Unsetenv("KUBERNETES_SERVICE_HOST"); err != nil {
		t.Fatal(err)
	}
	if got, want := DefaultConsumerName(), host+"-"+strconv.Itoa(os.Getpid()); got != want {
		t.Errorf("outside Kubernetes: %q, want %q", got, want)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	if got := DefaultConsumerName(); got != host {
		t.Errorf("in Kubernetes: %q, want the hostname %q", got, host)
	}
}

// ON_CONFLICT wait is accepted with LOCK_SCOPE issue or group (one of them): the line is
// the shared key's (the refusal of both at once is in TestValidationNamesTheSetting).
func TestWaitWithASharedScopeAccepted(t *testing.T) {
	for _, c := range []struct{ onConflict, scope string }{
		{"wait:10", "agent,issue"}, {"rebase.requested=wait,*=drop", "issue"}, {"wait", "group:m:lock_key"},
	} {
		var w Worker
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		w.Register(fs)
		if err := Parse(fs, []string{"--runner", "demo", "--agent", "rebase", "--branch", "c9s", "--on-conflict", c.onConflict, "--lock-scope", c.scope}); err != nil {
			t.Fatal(err)
		}
		if err := w.Validate(); err != nil {
			t.Errorf("ON_CONFLICT=%s LOCK_SCOPE=%s: %v", c.onConflict, c.scope, err)
			continue
		}
		sc, err := w.Scopes()
		if p, perr := w.Policies(); err != nil || perr != nil || !sc.Shared() || !p.Uses(lockmw.Wait) {
			t.Errorf("ON_CONFLICT=%s LOCK_SCOPE=%s: scopes %+v, %v; policies %v, %v", c.onConflict, c.scope, sc, err, p, perr)
		}
	}
}

// ON_CONFLICT supersede is accepted alone, in a table, and with LOCK_SCOPE agent (the
// refusals with a shared scope are in TestValidationNamesTheSetting).
func TestSupersedeAccepted(t *testing.T) {
	for _, c := range []struct{ onConflict, scope string }{
		{"supersede", "agent"}, {"triage.requested=supersede,*=delay:2m", ""}, {"rebase.requested=supersede,*=drop", "agent"},
	} {
		var w Worker
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		w.Register(fs)
		args := []string{"--runner", "demo", "--agent", "triage", "--on-conflict", c.onConflict}
		if c.scope != "" {
			args = append(args, "--lock-scope", c.scope)
		}
		if err := Parse(fs, args); err != nil {
			t.Fatal(err)
		}
		if err := w.Validate(); err != nil {
			t.Errorf("ON_CONFLICT=%s LOCK_SCOPE=%s: %v", c.onConflict, c.scope, err)
			continue
		}
		p, err := w.Policies()
		if err != nil || !p.Uses(lockmw.Supersede) {
			t.Errorf("ON_CONFLICT=%s: %v, %v", c.onConflict, p, err)
		}
	}
}
