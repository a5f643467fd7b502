package config

import (
	"strings"

	"github.com/ymirflow/ymirflow/event"
)

// Agents are the agent names, in pipeline order. Branches are the target
// branches of the downstream agents.
var (
	Agents   = event.Agents
	Branches = event.Branches
)

// ValidateAgentBranch checks an agent name and a branch as the worker and
// enqueue commands take them: the agent is one of [Agents]; triage takes no
// branch, every other agent one of [Branches].
func ValidateAgentBranch(agent, branch string) error {
	var p problems
	validateAgentBranch(&p, agent, branch, false)
	return p.err()
}

func validateAgentBranch(p *problems, agent, branch string, flagOnly bool) {
	add := p.add
	if flagOnly {
		add = p.addFlag
	}
	switch {
	case agent == "":
		add("agent", "is required: one of %s", strings.Join(Agents, "|"))
		return
	case !oneOf(agent, Agents...):
		add("agent", "= %q is not an agent: one of %s", agent, strings.Join(Agents, "|"))
		return
	}
	switch {
	case agent == "triage" && branch != "":
		add("branch", "= %q is not taken by agent triage, which reads every branch's issues", branch)
	case agent != "triage" && branch == "":
		add("branch", "is required for agent %s: one of %s", agent, strings.Join(Branches, "|"))
	case agent != "triage" && !oneOf(branch, Branches...):
		add("branch", "= %q is not a branch: one of %s", branch, strings.Join(Branches, "|"))
	}
}

// validateAgentBranchFilter checks optional agent and branch filters.
func validateAgentBranchFilter(p *problems, agent, branch string) {
	if agent != "" && !oneOf(agent, Agents...) {
		p.addFlag("agent", "= %q is not an agent: one of %s", agent, strings.Join(Agents, "|"))
	}
	if branch != "" && !oneOf(branch, Branches...) {
		p.addFlag("branch", "= %q is not a branch: one of %s", branch, strings.Join(Branches, "|"))
	}
	if agent == "triage" && branch != "" {
		p.addFlag("branch", "= %q is not taken by agent triage, which reads every branch's issues", branch)
	}
}
