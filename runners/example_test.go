package runners_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ymirflow/ymirflow/runners"
)

// An exec runner runs a command per event: the Task JSON on stdin, the event in YMIR_*
// variables, and the result as JSON on stdout.
func ExampleExecRunner() {
	r := runners.ExecRunner{
		Command:   `echo "rebasing $YMIR_ISSUE_KEY" >&2; echo '{"success":true,"merge_request_url":"https://mr.example/1"}'`,
		KillGrace: time.Second,
		// The agent gets PATH and nothing of the coordination store.
		Env: runners.BuildAgentEnv([]string{"PATH=/usr/bin:/bin", "REDIS_URL=redis://secret@db"},
			runners.EnvPolicy{Pass: []string{"REDIS_*"}, Withheld: []string{"REDIS_URL"}}).Env,
	}
	res, err := r.Run(context.Background(), runners.RunRequest{Agent: "rebase", Branch: "c9s", IssueKey: "RHEL-1", Attempt: 1,
		Payload: []byte(`{"metadata":{"jira_issue":"RHEL-1"}}`)})
	fmt.Println(res.Success, res.MergeRequestURL, err)
	// Output: true https://mr.example/1 <nil>
}

// ParseResult reads an agent's stdout: the JSON object, or the last line that is one.
func ExampleParseResult() {
	res, err := runners.ParseResult("triage", []byte("thinking...\n"+`{"resolution":"backport","target_branch":"rhel-9.6.0","data":{"package":"curl"}}`))
	fmt.Println(res.Resolution, res.TargetBranch, string(res.Data), err)
	_, err = runners.ParseResult("triage", []byte(`{"resolution":"maybe"}`))
	fmt.Println(err)
	// Output:
	// backport rhel-9.6.0 {"package":"curl"} <nil>
	// runner output is not a valid result: unknown resolution "maybe" (want one of rebase, backport, rebuild, clarification-needed, open-ended-analysis, postponed, not-affected, error)
}
