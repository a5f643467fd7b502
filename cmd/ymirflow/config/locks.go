package config

import (
	"flag"
	"strings"
)

// Locks is the settings of `ymirflow locks` and `ymirflow locks release`.
type Locks struct {
	Inspect
	Writer
	Agent string // --agent (flag only): only this agent's leases
	Issue string // --issue (flag only): only this issue's leases (direct lookups, no SCAN)
	Yes   bool   // --yes (flag only): release without asking
}

// Register defines locks' flags on fs.
func (c *Locks) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	c.Writer.register(fs)
	fs.StringVar(&c.Agent, "agent", "", "only this agent's leases: "+strings.Join(Agents, "|")+" (empty: every agent)")
	fs.StringVar(&c.Issue, "issue", "", "only this issue's leases, looked up directly instead of scanning")
	registerYes(fs, &c.Yes, "force-releasing a lease (locks release)")
	flagOnly(fs, "agent", "issue")
}

// Validate checks locks' settings.
func (c *Locks) Validate() error {
	var p problems
	c.Common.validate(&p)
	validateAgentBranchFilter(&p, c.Agent, "")
	validateIssueFilter(&p, c.Issue)
	return p.err()
}
