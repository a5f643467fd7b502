package config

import (
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Defaults of `ymirflow demo`.
const (
	DefaultDemoIssues   = 40
	DefaultDemoDuration = 400 * time.Millisecond // typical simulated agent run at --speed 1
)

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
