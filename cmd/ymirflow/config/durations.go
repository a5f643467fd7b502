package config

import (
	"time"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// DurationRange is the documented range of a duration setting, both ends accepted.
type DurationRange struct{ Min, Max time.Duration }

// DurationRanges are the documented ranges of the duration settings, by flag name;
// --help prints them and Validate enforces them. Each end, set alone, gives a worker
// that starts (TestDurationRangeEndsAlone): the settings it is related to follow it.
var DurationRanges = map[string]DurationRange{
	"lock-ttl":      {lease.MinTTL, 24 * time.Hour},
	"lock-max-hold": {lease.MinTTL, 30 * 24 * time.Hour},
	// Set alone, MAX_IDLE_TIME lowers LOCK_TTL to 2×MAX_IDLE_TIME, which must stay at
	// least the lease's minimum.
	"max-idle-time":         {lease.MinTTL / 2, 24 * time.Hour},
	"kill-grace":            {time.Millisecond, time.Hour},
	"block-time":            {time.Millisecond, 10 * time.Minute},
	"claim-interval":        {time.Millisecond, time.Hour},
	"demo-duration":         {0, time.Hour},
	"progress-timeout":      {0, 24 * time.Hour},
	"jira-timeout":          {time.Millisecond, time.Hour},
	"interval":              {time.Millisecond, 7 * 24 * time.Hour},
	"stale-label-threshold": {time.Millisecond, 365 * 24 * time.Hour},
}

// rangeHelp is the "; from A to B" that --help shows for a duration setting.
func rangeHelp(flagName string) string {
	r := DurationRanges[flagName]
	return "; from " + fmtDur(r.Min) + " to " + fmtDur(r.Max)
}

func checkRange(p *problems, flagName string, d time.Duration) {
	r := DurationRanges[flagName]
	switch {
	case d <= 0 && r.Min > 0:
		p.add(flagName, "= %s must be positive (from %s to %s)", fmtDur(d), fmtDur(r.Min), fmtDur(r.Max))
	case d < r.Min || d > r.Max:
		p.add(flagName, "= %s must be from %s to %s", fmtDur(d), fmtDur(r.Min), fmtDur(r.Max))
	}
}

func inRange(flagName string, d time.Duration) bool {
	r := DurationRanges[flagName]
	return d >= r.Min && d <= r.Max
}
