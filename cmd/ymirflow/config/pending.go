package config

import (
	"flag"
	"strings"
)

// Pending is the settings of `ymirflow pending`.
type Pending struct {
	Inspect
	Agent  string // --agent (flag only): only this agent's groups (empty: every agent)
	Branch string // --branch (flag only): only this branch's groups (empty: every branch)
	Issue  string // --issue (flag only): only this issue's entries (the group summaries stay whole)
}

// Register defines pending's flags on fs.
func (c *Pending) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	fs.StringVar(&c.Agent, "agent", "", "only this agent's groups: "+strings.Join(Agents, "|")+" (empty: every agent)")
	fs.StringVar(&c.Branch, "branch", "", "only this branch's groups: "+strings.Join(Branches, "|")+" (empty: every branch)")
	fs.StringVar(&c.Issue, "issue", "", "only this issue's pending entries, e.g. RHEL-123")
	flagOnly(fs, "agent", "branch", "issue")
}

// Validate checks pending's settings.
func (c *Pending) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateAgentBranchFilter(&p, c.Agent, c.Branch)
	validateIssueFilter(&p, c.Issue)
	return p.err()
}
