package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/runners"
)

// The worker's agents never get the coordination store's settings, named or not, and
// get ymirflow's own Jira credentials only when RUNNER_ENV names them exactly.
func TestAgentEnvPolicyWithholdsRedisAndGuardsJiraCredentials(t *testing.T) {
	worker := EnvNamesOf("worker")
	for _, tc := range []struct {
		runnerEnv, want string
		credentials     []string
	}{
		{"JIRA_*,REDIS_*,TOOL_*", "PATH=/bin JIRA_URL=https://j TOOL_X=1", nil},
		{"JIRA_TOKEN,JIRA_*", "PATH=/bin JIRA_TOKEN=jt JIRA_URL=https://j", []string{"JIRA_TOKEN"}},
	} {
		w := Worker{RunnerEnv: tc.runnerEnv}
		p, err := w.AgentEnvPolicy()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range append(slices.Clone(p.Credentials), p.Withheld...) {
			if name != "REDISCLI_AUTH" && !slices.Contains(worker, name) {
				t.Errorf("policy names %s, which is not a worker setting", name)
			}
		}
		environ := []string{"PATH=/bin", "JIRA_TOKEN=jt", "JIRA_TOKEN_FILE=/run/t", "JIRA_EMAIL=e@x",
			"JIRA_URL=https://j", "REDIS_URL=redis://:pw@h", "REDISCLI_AUTH=pw", "TOOL_X=1"}
		e := runners.BuildAgentEnv(environ, p)
		if got := strings.Join(e.Env, " "); got != tc.want {
			t.Errorf("RUNNER_ENV=%s: agent env %q, want %q", tc.runnerEnv, got, tc.want)
		}
		if !slices.Equal(e.Credentials, tc.credentials) {
			t.Errorf("RUNNER_ENV=%s: credentials %v, want %v", tc.runnerEnv, e.Credentials, tc.credentials)
		}
	}
}
