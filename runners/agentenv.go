package runners

import (
	"slices"
	"strings"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// AgentEnv is the environment the exec runner hands an agent, besides the YMIR_*
// variables and JIRA_ISSUE it sets per event. Agents read untrusted issue text, so they
// get only what they need (README, "Writing an agent").
type AgentEnv struct {
	// Env is KEY=VALUE, in the order of the worker's environment.
	Env []string
	// Secrets are the values of the passed variables whose names look secret
	// (redact.SecretName): the worker redacts them from everything it writes.
	Secrets []string
	// JiraCredentials names ymirflow's own Jira credentials that RUNNER_ENV named
	// explicitly (the worker says so at start-up).
	JiraCredentials []string
}

// BaseEnvNames are passed to every agent when the worker has them.
func BaseEnvNames() []string { return []string{"PATH", "HOME", "LANG", "TZ", "TMPDIR"} }

// jiraCredentialNames are ymirflow's own Jira credentials: a glob never passes them.
func jiraCredentialNames() []string { return []string{"JIRA_TOKEN", "JIRA_TOKEN_FILE", "JIRA_EMAIL"} }

// neverPassed are ymirflow's Redis settings: whoever holds them controls the
// coordination store (forge events, delete leases), so no agent gets them, named or not.
func neverPassed(name string) bool { return name == "REDIS_URL" || name == "REDISCLI_AUTH" }

// BuildAgentEnv picks an agent's environment from environ (os.Environ()): the base
// variables, and those matching patterns (RUNNER_ENV: names, and PREFIX_* globs).
func BuildAgentEnv(environ, patterns []string) AgentEnv {
	var e AgentEnv
	base := BaseEnvNames()
	jira := jiraCredentialNames()
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || neverPassed(name) || strings.HasPrefix(name, "YMIR_") || name == "JIRA_ISSUE" {
			continue // YMIR_* and JIRA_ISSUE are set per event, never inherited
		}
		explicit := slices.Contains(patterns, name)
		pass := slices.Contains(base, name) || explicit
		if !pass && !slices.Contains(jira, name) {
			pass = slices.ContainsFunc(patterns, func(p string) bool {
				prefix, glob := strings.CutSuffix(p, "*")
				return glob && strings.HasPrefix(name, prefix)
			})
		}
		if !pass {
			continue
		}
		if slices.Contains(jira, name) {
			e.JiraCredentials = append(e.JiraCredentials, name)
		}
		e.Env = append(e.Env, kv)
		if redact.SecretName(name) && value != "" {
			e.Secrets = append(e.Secrets, value)
		}
	}
	return e
}
