package config

import (
	"flag"
	"strings"
)

// Enqueue is the settings of `ymirflow enqueue`; the issue keys are the
// positional arguments.
type Enqueue struct {
	Common
	Tracing
	Agent         string // --agent (flag only)
	Branch        string // --branch (flag only): every agent but triage
	UserTriggered bool   // --user-triggered (flag only): publish to the :todo stream
}

// Register defines enqueue's flags on fs.
func (e *Enqueue) Register(fs *flag.FlagSet) {
	e.Common.Register(fs)
	e.Tracing.register(fs)
	fs.StringVar(&e.Agent, "agent", "triage", "agent whose stream gets the requests: "+strings.Join(Agents, "|"))
	fs.StringVar(&e.Branch, "branch", "", "target branch: "+strings.Join(Branches, "|")+" (every agent but triage)")
	fs.BoolVar(&e.UserTriggered, "user-triggered", false, "publish as user-triggered work (the :todo stream)")
	flagOnly(fs, "agent", "branch", "user-triggered")
	required(fs, "branch", "required for every agent but triage")
}

// Validate checks enqueue's settings.
func (e *Enqueue) Validate() error {
	var p problems
	e.Common.validate(&p)
	e.Tracing.validate(&p)
	validateAgentBranch(&p, e.Agent, e.Branch, true)
	return p.err()
}
