package config

import (
	"flag"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"
)

// Writer is the settings every operator write (locks release, replay, dlq requeue, dlq
// purge, budget approve) shares: who the operator is and why they write,
// recorded in the audit trail before the write runs.
type Writer struct {
	// Reason (--reason, flag only) is why; a write without one is refused.
	Reason string
	// Operator (--operator, YMIR_OPERATOR) names the operator in the audit trail;
	// default: the user name @ the host name.
	Operator string
}

func (w *Writer) register(fs *flag.FlagSet) {
	fs.StringVar(&w.Reason, "reason", "", "why you make this write: required for every write, recorded in the audit trail with who and when")
	stringVarEnv(fs, &w.Operator, "operator", "YMIR_OPERATOR", "", "who you are in the audit trail (default: your user name @ this host)")
	flagOnly(fs, "reason")
}

// NeedReason refuses a write (what: "locks release") without --reason, naming the flag.
func (w *Writer) NeedReason(what string) error {
	if strings.TrimSpace(w.Reason) == "" {
		return &SettingError{Flag: "reason", Msg: fmt.Sprintf("is required for %s: say why, e.g. --reason \"the run hangs\" (recorded in the audit trail with who and when)", what)}
	}
	if len(w.Reason) > 500 {
		return &SettingError{Flag: "reason", Msg: "is longer than 500 characters"}
	}
	return nil
}

// Who is the operator's identity and where they write from: Operator (default
// user@host) and "cli <host>".
func (w *Writer) Who() (who, from string) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	who = strings.TrimSpace(w.Operator)
	if who == "" {
		name := os.Getenv("USER")
		if u, err := user.Current(); err == nil && u.Username != "" {
			name = u.Username
		}
		if name == "" {
			name = "unknown"
		}
		who = name + "@" + host
	}
	return who, "cli " + host
}

// Audit is the settings of `ymirflow audit`: the operators' audit trail.
type Audit struct {
	Inspect
	Who    string        // --who (flag only): only this operator's writes
	Action string        // --action (flag only): only this action
	Issue  string        // --issue (flag only): only writes on this issue
	Since  time.Duration // --since (flag only): only the writes of this last while
	Limit  int           // --limit (flag only): at most this many writes
}

// Register defines audit's flags on fs.
func (c *Audit) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	fs.StringVar(&c.Who, "who", "", "only this operator's writes (as recorded: user@host, or the console operator's name)")
	fs.StringVar(&c.Action, "action", "", "only this action: release, replay, requeue, purge, budget approve")
	fs.StringVar(&c.Issue, "issue", "", "only the writes on this issue")
	fs.DurationVar(&c.Since, "since", 0, "only the writes of this last while, e.g. 24h (0: all)")
	fs.IntVar(&c.Limit, "limit", 100, "at most this many writes, newest first")
	flagOnly(fs, "who", "action", "issue", "since", "limit")
}

// Validate checks audit's settings.
func (c *Audit) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateIssueFilter(&p, c.Issue)
	if c.Since < 0 {
		p.addFlag("since", "= %s must not be negative", fmtDur(c.Since))
	}
	if c.Limit < 1 || c.Limit > 100_000 {
		p.addFlag("limit", "= %d must be from 1 to 100000", c.Limit)
	}
	return p.err()
}
