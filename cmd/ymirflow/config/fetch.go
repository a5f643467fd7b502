package config

import (
	"flag"
	"strings"
	"time"
)

// Defaults of `ymirflow fetch`.
const (
	DefaultFetchInterval = 5 * time.Minute
)

// Fetch is the settings of `ymirflow fetch`: the Jira sweep.
type Fetch struct {
	Common
	Jira
	Tracing

	Once                bool          // --once, ONCE: one sweep, then exit
	Interval            time.Duration // --interval, INTERVAL: time between sweeps without --once
	MaxIssues           int           // --max-issues, MAX_ISSUES: issues published per sweep (0: no limit)
	StaleLabelThreshold time.Duration // --stale-label-threshold, STALE_LABEL_THRESHOLD: in-flight labels older than this are recovered
}

// Register defines the fetcher's flags on fs.
func (f *Fetch) Register(fs *flag.FlagSet) {
	f.Common.Register(fs)
	f.Jira.Register(fs)
	f.Tracing.register(fs)
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
	f.Tracing.validate(&p)
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
