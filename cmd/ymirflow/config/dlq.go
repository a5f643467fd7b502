package config

import (
	"flag"
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/inspect"
)

// DLQ is the settings of `ymirflow dlq`.
type DLQ struct {
	Inspect
	Writer
	Issue  string // --issue (flag only): only this issue's dead letters (list, requeue --all)
	Before string // --before (flag only): only dead letters older than a stream id or a duration (list, purge)
	All    bool   // --all (flag only): requeue every dead letter (of --issue)
	Yes    bool   // --yes (flag only): purge without asking
}

// Register defines dlq's flags on fs.
func (c *DLQ) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	c.Writer.register(fs)
	fs.StringVar(&c.Issue, "issue", "", "only this issue's dead letters (list, requeue --all)")
	fs.StringVar(&c.Before, "before", "", "only dead letters older than this: a stream id (1700000000000-0) or an age (72h) (list, purge)")
	fs.BoolVar(&c.All, "all", false, "requeue every dead letter (only --issue's with --issue)")
	registerYes(fs, &c.Yes, "purging dead letters")
	flagOnly(fs, "issue", "before", "all")
}

// BeforeID returns --before as a stream id: itself, or for an age the id of
// that long before now ("" when unset).
func (c *DLQ) BeforeID(now time.Time) string {
	if c.Before == "" || inspect.CheckID(c.Before) == nil {
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
	if c.Before != "" && inspect.CheckID(c.Before) != nil {
		if d, err := time.ParseDuration(c.Before); err != nil || d <= 0 {
			p.addFlag("before", "= %q is neither a stream id (1700000000000-0) nor a positive age (72h)", c.Before)
		}
	}
	return p.err()
}
