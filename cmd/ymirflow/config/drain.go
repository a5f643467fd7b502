package config

import (
	"flag"
	"strings"
	"time"
)

// Drain is the settings of `ymirflow drain`: a target (one of --all, --agent with
// --branch, --worker), --undo, --wait and --timeout; no target lists the standing
// requests.
type Drain struct {
	Inspect
	Writer
	All     bool          // --all (flag only): every worker (the console asks for admin)
	Agent   string        // --agent (flag only): the workers of this agent
	Branch  string        // --branch (flag only): only this branch of --agent
	Worker  string        // --worker (flag only): one worker by its consumer name
	Undo    bool          // --undo (flag only): withdraw the request: the workers take work again
	Wait    bool          // --wait (flag only): wait until every targeted worker reports drained
	Timeout time.Duration // --timeout (flag only): how long --wait waits
}

// Register defines drain's flags on fs.
func (c *Drain) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	c.Writer.register(fs)
	fs.BoolVar(&c.All, "all", false, "drain every worker of every agent")
	fs.StringVar(&c.Agent, "agent", "", "drain the workers of this agent: "+strings.Join(Agents, "|"))
	fs.StringVar(&c.Branch, "branch", "", "with --agent: only its workers of this branch (empty: every branch)")
	fs.StringVar(&c.Worker, "worker", "", "drain one worker by its consumer name (CONSUMER_NAME, or NAME-i for one subscription)")
	fs.BoolVar(&c.Undo, "undo", false, "withdraw the drain request of this target: its workers take work again")
	fs.BoolVar(&c.Wait, "wait", false, "wait, showing progress, until every targeted worker reports drained")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "how long --wait waits before it gives up (exit 1)")
	flagOnly(fs, "all", "agent", "branch", "worker", "undo", "wait", "timeout")
}

// Targeted reports whether a target was given (a write), else drain lists.
func (c *Drain) Targeted() bool { return c.All || c.Agent != "" || c.Worker != "" }

// Validate checks drain's settings.
func (c *Drain) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateAgentBranchFilter(&p, c.Agent, c.Branch)
	n := 0
	for _, set := range []bool{c.All, c.Agent != "", c.Worker != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		p.addFlag("all", "names every worker: give one of --all, --agent, --worker")
	}
	if c.Branch != "" && c.Agent == "" {
		p.addFlag("branch", "needs --agent")
	}
	if strings.ContainsAny(c.Worker, " \t:") {
		p.addFlag("worker", "= %q is not a consumer name (no space or colon)", c.Worker)
	}
	if c.Timeout <= 0 {
		p.addFlag("timeout", "= %s must be positive", fmtDur(c.Timeout))
	}
	if (c.Undo || c.Wait) && !c.Targeted() {
		p.addFlag("undo", "and --wait need a target: --all, --agent A [--branch B] or --worker NAME")
	}
	if c.Undo && c.Wait {
		p.addFlag("wait", "waits for a drain, not for its --undo")
	}
	return p.err()
}
