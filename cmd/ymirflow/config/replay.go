package config

import (
	"flag"
	"strings"
)

// Replay is the settings of `ymirflow replay`.
type Replay struct {
	Inspect
	Writer
	Tracing
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
	c.Writer.register(fs)
	c.Tracing.register(fs)
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
	c.Tracing.validate(&p)
	if strings.TrimSpace(c.Stream) == "" {
		p.addFlag("stream", "is required: the input stream to replay, e.g. triage or rebase:c9s")
	}
	validateRangeID(&p, "from", c.From)
	validateRangeID(&p, "to", c.To)
	validateIssueFilter(&p, c.Issue)
	return p.err()
}
