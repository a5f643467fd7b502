package config

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Usage returns a function suitable for fs.Usage that prints, for each flag,
// its name, type, meaning, default and environment variable.
func Usage(fs *flag.FlagSet) func() {
	return func() {
		w := fs.Output()
		if fs.Name() == "" {
			fmt.Fprintf(w, "Usage:\n")
		} else {
			fmt.Fprintf(w, "Usage of %s:\n", fs.Name())
		}
		WriteUsage(w, fs)
	}
}

// WriteUsage writes one short line per flag of fs to w (--help): flag and type,
// environment variable ("flag only" for a filter or mode of one invocation),
// "required" where it is, the setting's meaning in a few words (Short), and default
// (when not the zero value). WriteReference writes the whole text.
func WriteUsage(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		name, env, usage := describe(f, Short(fs.Name(), f))
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", name, env, usage)
	})
	_ = tw.Flush()
}

// WriteReference writes the settings of command fs in full, as a Markdown table:
// docs/configuration.md is made of them (TestConfigurationReference).
func WriteReference(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "| Flag | Variable | Meaning |")
	fmt.Fprintln(w, "|---|---|---|")
	fs.VisitAll(func(f *flag.Flag) {
		name, env, usage := describe(f, f.Usage)
		cell := func(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
		fmt.Fprintf(w, "| `%s` | %s | %s |\n", cell(name), cell(env), cell(usage))
	})
}

// describe returns f's name and type, its variable, and meaning with its requirement
// and default.
func describe(f *flag.Flag, meaning string) (name, env, usage string) {
	plain := *f // UnquoteUsage names the type from the concrete Value
	if s, ok := f.Value.(*setting); ok {
		plain.Value = s.Value
	}
	plain.Usage = meaning
	typ, usage := flag.UnquoteUsage(&plain)
	name = "--" + f.Name
	if typ != "" {
		name += " " + typ
	}
	if req := Required(f); req != "" {
		usage = "[" + req + "] " + usage
	}
	if def := defaultString(f); def != "" {
		usage += " (default " + def + ")"
	}
	env = "(flag only)"
	if e := EnvName(f); e != "" {
		env = "$" + e
	}
	return name, env, usage
}

// Short returns the line --help of command cmd prints for f: its own short line when
// the first clause of its meaning (up to the first "; " or ". " outside parentheses)
// is still long, else that clause; and a duration's range.
func Short(cmd string, f *flag.Flag) string {
	s, ok := shortUsage[cmd+" --"+f.Name]
	if !ok {
		s, ok = shortUsage["--"+f.Name]
	}
	if !ok {
		s = firstClause(f.Usage)
	}
	// A duration's range stays on its line: a value outside it is refused.
	if r := rangeHelp(f.Name); strings.Contains(f.Usage, r) && !strings.Contains(s, r) {
		s += r
	}
	return s
}

// firstClause is u up to its first "; " or ". " outside parentheses (not the dot of
// "e.g." or "i.e.").
func firstClause(u string) string {
	depth := 0
	for i := 0; i+1 < len(u); i++ {
		switch u[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ';', '.':
			// "e.g. " and "i.e. " do not end a clause.
			if depth == 0 && u[i+1] == ' ' && !strings.HasSuffix(u[:i], "e.g") && !strings.HasSuffix(u[:i], "i.e") {
				return u[:i]
			}
		}
	}
	return u
}

// shortUsage is the --help line of the settings whose first clause is too long for
// one line, by "--flag", or by "COMMAND --flag" where commands mean different things;
// the whole text is in docs/configuration.md.
var shortUsage = map[string]string{
	"--budget-issue-usd":          "spend limit of one issue in USD, every run and agent (0: off)",
	"--permits":                   "upstream rate limits shared by every worker, e.g. llm:claude=5/s,jira=10/s",
	"--progress-timeout":          "a silent agent's run loses its lease after this (0: off)",
	"--operators-file":            "the console's operators, one a line: NAME ROLE sha256:HEX",
	"--before":                    "only dead letters older than a stream id or an age (72h) (list, purge)",
	"--branch":                    "target branch: c9s|c10s",
	"--consumer-name":             "this worker's consumer name, unique per live process",
	"--jira-rate":                 "Jira requests per period shared by every process, e.g. 5/s",
	"--max-retries":               "attempts at a failing event before its dead letter",
	"--log-level":                 "trace|debug|info|warn|error|fatal|panic|disabled",
	"--max-len":                   "approximate length cap of every stream written (0: none)",
	"--jira-rate-burst":           "requests JIRA_RATE lets go at once (0: one second's worth)",
	"--run-rate":                  "run starts of this agent per period, all workers, e.g. 30/h",
	"--demo-duration":             "typical length of a simulated run (runner demo; 0: instant)",
	"dev --demo-duration":         "typical length of a simulated agent run (without --exec)",
	"--exec":                      "/bin/sh -c command the exec runner runs per event",
	"dev --exec":                  "your agent, run by every worker per event (empty: simulated agents)",
	"dev --concurrency":           "every worker's CONCURRENCY: events handled at once per input stream",
	"--jira-comment-group":        "Jira group the pipeline's comments are restricted to (empty: all)",
	"--jira-own-account":          "ymirflow's own Jira accounts, whose events and comments are ignored",
	"--jira-rate-limit":           "Jira requests per second, this process (negative: none)",
	"--jira-token-file":           "file holding the Jira token, read once at start-up",
	"--jira-trigger-group":        "Jira group allowed to trigger work (empty: anyone)",
	"--keep":                      "keep the demo's data (namespace or embedded Redis) after the run",
	"--kill-grace":                "SIGTERM-to-SIGKILL grace for a runner's processes",
	"--lock-max-hold":             "longest a handler may hold a lease",
	"--lock-scope":                "what a run's lease guards: agent, issue, group:<paths>",
	"dev --lock-scope":            "every worker's LOCK_SCOPE: agent, issue, group:<paths>",
	"--lock-ttl":                  "per-issue lease TTL, extended every LOCK_TTL/3",
	"--lock-wait-aof":             "with LOCK_WAIT_REPLICAS: WAITAOF instead of WAIT",
	"--lock-wait-replicas":        "replicas that must acknowledge each lease acquire and extend",
	"--log-dir":                   "directory of the components' log files (empty: a new temp dir)",
	"--log-file":                  "file of the workers' logs (-: stderr; empty: a new temp file)",
	"--mailbox-depth":             "most follow-ups waiting in one lease's mailbox (deliver)",
	"dev --mailbox-depth":         "every worker's MAILBOX_DEPTH (deliver)",
	"--max-event-bytes":           "largest stream entry published or run",
	"--max-idle-time":             "pending entries idle this long are claimed",
	"--metrics-addr":              "address of /metrics, /healthz, /readyz (empty: off)",
	"--on-conflict":               "what becomes of a busy event, per type (wait: the key's line)",
	"--run-limits":                "runs at once per agent and per event field value, fair turns",
	"dev --on-conflict":           "every worker's ON_CONFLICT, per event type",
	"--otlp-endpoint":             "OpenTelemetry collector's OTLP/HTTP base URL (empty: none)",
	"--read-batch":                "most entries one stream read takes while events are quick",
	"demo --redis-url":            "Redis URL (empty: an embedded Redis in this process)",
	"--redis-url":                 "Redis URL (Cluster, Sentinel, TLS forms: docs)",
	"--ymir-namespace":            "prefix of every stream and key (pipelines sharing a Redis)",
	"--jira-max-retries":          "retries of a Jira request after a 429, a 5xx or a network error",
	"--jira-api":                  "Jira REST flavour: cloud (v3), server (v2) or auto",
	"--webhook-addr":              "listen address of the webhook receiver",
	"--require-aof":               "refuse to start unless Redis keeps an append-only file",
	"--runner-env":                "variables of the worker's environment passed to the exec runner",
	"--stale-label-threshold":     "an in-flight label not updated for this long is recovered",
	"--jira-url":                  "Jira base URL (empty: Jira writes are logged, not sent)",
	"dev --jira-url":              "a real Jira's base URL (empty: the fake Jira, at --fakejira-addr)",
	"fetch --jira-url":            "Jira base URL",
	"webhook --jira-url":          "Jira base URL",
	"--speed":                     "speed of the simulated agents: a factor (2x) or the typical run",
	"replay --stream":             "input stream to replay (ymir:rebase:c9s or rebase:c9s)",
	"replay --to":                 "last stream id of the range (inclusive)",
	"--trace-url-template":        "trace viewer URL of a trace, {trace_id} standing for its id",
	"--traces-exporter":           "where spans go: otlp or none (empty: otlp with --otlp-endpoint)",
	"fakejira --webhook":          "URLs (comma-separated) that get a signed delivery on every change",
	"--webhook-approval-usd":      "USD a maintainer's ymir_budget_approved label adds to the budget (0: off)",
	"--webhook-comment-max-bytes": "bytes of a maintainer's comment published to its run (at least 64)",
	"--webhook-deadline":          "bound of the answer to one delivery",
	"--webhook-delivery-ttl":      "how long delivery ids are remembered, to drop Jira's retries",
	"--webhook-payload-max-age":   "a delivery older than this is read from Jira again",
	"--webhook-secret":            "the Jira webhook's secret",
	"--webhook-secret-file":       "file holding the webhook secret, read once at start-up",
	"--insecure-no-signature":     "accept unsigned deliveries (tests only)",
}

func defaultString(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return ""
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			if d, err := time.ParseDuration(f.DefValue); err == nil {
				return fmtDur(d)
			}
		case string:
			return strconv.Quote(f.DefValue)
		}
	}
	return f.DefValue
}

// fmtDur prints a duration without trailing zero units: 1m rather than 1m0s,
// 6h rather than 6h0m0s.
func fmtDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
