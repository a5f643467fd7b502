package runners

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ymirflow/ymirflow/event"
)

// Runner does an agent's actual work for one event. It must honour ctx: the context is
// cancelled when the lease is lost or the worker shuts down, and the run must then end
// promptly (its result is discarded and the event is redelivered).
type Runner interface {
	Run(ctx context.Context, req RunRequest) (Result, error)
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, req RunRequest) (Result, error)

// Run implements Runner.
func (f RunnerFunc) Run(ctx context.Context, req RunRequest) (Result, error) { return f(ctx, req) }

// RunRequest is one event handed to a runner.
type RunRequest struct {
	Agent    string // triage, rebase, backport, rebuild
	Branch   string // the worker's branch (c9s, c10s); "" for triage
	IssueKey string // canonical
	// Fence of the lease the run happens under (0 without a lease).
	Fence int64
	// Attempt is the 1-based attempt number of this event (metadata attempt).
	Attempt int
	// MessageID and Stream name the stream entry being handled.
	MessageID     string
	Stream        string
	UserTriggered bool
	// Payload is the Task JSON exactly as received; Task is its decoded form.
	Payload []byte
	Task    event.Task
	// Mailbox, when set, feeds the agent the issue's follow-ups while it runs (the
	// exec runner: YMIR_MAILBOX). Default: nil, none.
	Mailbox Mailbox
	// Control, when set, serves the agent's control channel while it runs (the exec
	// runner: YMIR_CONTROL_FD). Default: nil, none.
	Control Control
}

// Result is what a runner reports. Triage runners fill Resolution, TargetBranch and
// Data; downstream runners fill Success, MergeRequestURL and Error.
type Result struct {
	Resolution   string          `json:"resolution,omitempty"`
	TargetBranch string          `json:"target_branch,omitempty"`
	Data         json.RawMessage `json:"data,omitempty"`

	Success         bool   `json:"success"`
	MergeRequestURL string `json:"merge_request_url,omitempty"`
	Error           string `json:"error,omitempty"`

	// FollowupsAcked lists the ids of the follow-ups (YMIR_MAILBOX lines) the agent
	// took into account during the run: they are delivered. Those it does not list
	// start the issue's next run, in its Task JSON ("followups").
	FollowupsAcked []string `json:"followups_acked,omitempty"`
	// Delivered lists the ids of the follow-ups the runner handed the agent during the
	// run (set by the runner, not the agent), in their order.
	Delivered []string `json:"-"`

	// Extra holds a triage result's other top-level fields (e.g. dist_git_namespace,
	// downstream_component, jira_summary): they are copied into the downstream Task's
	// metadata, as the Python TriageState carries them.
	Extra map[string]json.RawMessage `json:"-"`
}

// ErrBadOutput means a runner printed something that is not a valid result. The event is
// retried, then dead-lettered.
var ErrBadOutput = errors.New("runner output is not a valid result")

// ParseResult decodes a runner's stdout for agent. The output is the JSON object, or,
// when the runner also logged to stdout, its last line that is a JSON object. A triage
// result needs a known resolution; a downstream result needs a boolean "success".
func ParseResult(agent string, out []byte) (Result, error) {
	obj, err := lastObject(out)
	if err != nil {
		return Result{}, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(obj, &fields); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadOutput, err)
	}
	var r Result
	if err := json.Unmarshal(obj, &r); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadOutput, err)
	}
	if agent == "triage" {
		if r.Resolution == "" {
			return Result{}, fmt.Errorf("%w: no \"resolution\" (want one of %s)", ErrBadOutput, strings.Join(Resolutions, ", "))
		}
		if !slices.Contains(Resolutions, r.Resolution) {
			return Result{}, fmt.Errorf("%w: unknown resolution %q (want one of %s)", ErrBadOutput, r.Resolution, strings.Join(Resolutions, ", "))
		}
		if len(r.Data) > 0 && !bytes.HasPrefix(bytes.TrimSpace(r.Data), []byte("{")) && string(bytes.TrimSpace(r.Data)) != "null" {
			return Result{}, fmt.Errorf("%w: \"data\" must be an object", ErrBadOutput)
		}
		for _, k := range []string{"resolution", "target_branch", "data", "success", "merge_request_url", "error", "followups_acked"} {
			delete(fields, k)
		}
		if len(fields) > 0 {
			r.Extra = fields
		}
		return r, nil
	}
	raw, ok := fields["success"]
	if !ok {
		return Result{}, fmt.Errorf("%w: no boolean \"success\"", ErrBadOutput)
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		return Result{}, fmt.Errorf("%w: \"success\" is not a boolean", ErrBadOutput)
	}
	return r, nil
}

// lastObject returns out if it is one JSON object, else its last line that is one.
func lastObject(out []byte) ([]byte, error) {
	t := bytes.TrimSpace(out)
	if len(t) == 0 {
		return nil, fmt.Errorf("%w: empty output", ErrBadOutput)
	}
	if t[0] == '{' && json.Valid(t) {
		return t, nil
	}
	lines := bytes.Split(t, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		l := bytes.TrimSpace(lines[i])
		if len(l) > 0 && l[0] == '{' && json.Valid(l) {
			return l, nil
		}
	}
	return nil, fmt.Errorf("%w: no JSON object in %q", ErrBadOutput, clip(t, 200))
}

func clip(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
