package runners

import (
	"slices"
	"strings"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// AgentEnv is the environment the exec runner hands an agent, besides the YMIR_*
// variables and JIRA_ISSUE it sets per event. Agents read untrusted issue text, so they
// get only what they need (docs/agents.md).
type AgentEnv struct {
	// Env is KEY=VALUE, in the order of the worker's environment.
	Env []string
	// Secrets are the values of the passed variables whose names look secret
	// (redact.SecretName): the worker redacts them from everything it writes.
	Secrets []string
	// Credentials lists the variables of EnvPolicy.Credentials that EnvPolicy.Pass
	// named explicitly, and so were passed (the worker says so at start-up).
	Credentials []string
}

// EnvPolicy says which of the worker's variables an agent gets. The zero policy
// passes BaseEnvNames alone.
type EnvPolicy struct {
	// Pass names the variables to pass besides the base ones: exact names, and
	// PREFIX_* globs. Default: none.
	Pass []string
	// Credentials are the worker's own credentials (ymirflow's Jira account): a glob
	// never passes them, only their exact name in Pass does. Default: none.
	Credentials []string
	// Withheld are never passed, named or not: whoever holds them controls the
	// coordination store (forge events, delete leases). Default: none; the binary
	// withholds its Redis settings.
	Withheld []string
}

// BaseEnvNames are passed to every agent when the worker has them.
func BaseEnvNames() []string { return []string{"PATH", "HOME", "LANG", "TZ", "TMPDIR"} }

// BuildAgentEnv picks an agent's environment from environ (os.Environ()) by policy p.
func BuildAgentEnv(environ []string, p EnvPolicy) AgentEnv {
	var e AgentEnv
	base := BaseEnvNames()
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || slices.Contains(p.Withheld, name) || strings.HasPrefix(name, "YMIR_") || name == "JIRA_ISSUE" {
			continue // YMIR_* and JIRA_ISSUE are set per event, never inherited
		}
		credential := slices.Contains(p.Credentials, name)
		pass := slices.Contains(base, name) || slices.Contains(p.Pass, name)
		if !pass && !credential {
			pass = slices.ContainsFunc(p.Pass, func(pat string) bool {
				prefix, glob := strings.CutSuffix(pat, "*")
				return glob && strings.HasPrefix(name, prefix)
			})
		}
		if !pass {
			continue
		}
		if credential {
			e.Credentials = append(e.Credentials, name)
		}
		e.Env = append(e.Env, kv)
		if redact.SecretName(name) && value != "" {
			e.Secrets = append(e.Secrets, value)
		}
	}
	return e
}
