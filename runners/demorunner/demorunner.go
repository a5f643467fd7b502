package demorunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	"github.com/ymirflow/ymirflow/runners"
)

// Outcomes of a downstream Runner run, as keys of Runner.Mix.
const (
	Success = "success" // {"success": true, "merge_request_url": ...}
	Failure = "failure" // {"success": false, "error": ...}: a clean failure
	Crash   = "error"   // the runner fails (as a crashed agent would)
)

// DefaultTriageMix is the triage outcome mix of Runner (weights by resolution).
var DefaultTriageMix = map[string]int{
	runners.ResolutionBackport: 35, runners.ResolutionRebase: 20, runners.ResolutionRebuild: 10, runners.ResolutionClarification: 10,
	runners.ResolutionOpenEnded: 5, runners.ResolutionPostponed: 5, runners.ResolutionNotAffected: 10, runners.ResolutionError: 5,
}

// DefaultDownstreamMix is the downstream outcome mix of Runner.
var DefaultDownstreamMix = map[string]int{Success: 80, Failure: 15, Crash: 5}

// DefaultBranches are the target branches a demo triage picks from.
var DefaultBranches = []string{"rhel-9.6.0", "c9s", "c10s", "rhel-10.1", "rhel-8.10.0"}

// ErrCrash is the error of a simulated agent crash.
var ErrCrash = errors.New("demo runner: simulated agent crash")

// Runner simulates the agents. Everything about a run (outcome, target branch,
// duration) is a hash of Seed, the agent, the issue key and the attempt, so a run is
// reproducible and a retry may turn out differently from the first attempt.
type Runner struct {
	// Duration is the typical length of a run: each run takes between half and one and a
	// half times it. Zero: runs return at once.
	Duration time.Duration
	Seed     int64
	// Mix weighs the outcomes: resolutions for triage (DefaultTriageMix), Success,
	// Failure and Crash for the downstream agents (DefaultDownstreamMix). Nil:
	// the default of the agent. Keys with weight 0 never happen.
	Mix map[string]int
	// Branches a triage picks its target branch from; an empty string means "no target
	// branch" (nothing is dispatched). Nil: DefaultBranches.
	Branches []string
	// Followups makes a run read its mailbox while it works (RunRequest.Mailbox, the
	// deliver policy) and acknowledge every follow-up it reads, as an agent that acts on
	// a maintainer's comment does: the handler records each followup.delivered. Without
	// it follow-ups are never read (they start the issue's next run).
	Followups bool
}

// Outcome returns the outcome, target branch and duration of a run, without running it.
func (d Runner) Outcome(agent, issueKey string, attempt int) (outcome, branch string, took time.Duration) {
	mix := d.Mix
	if mix == nil {
		mix = DefaultDownstreamMix
		if agent == "triage" {
			mix = DefaultTriageMix
		}
	}
	outcome = PickWeighted(mix, d.hash("outcome", agent, issueKey, attempt))
	if agent == "triage" {
		branches := d.Branches
		if branches == nil {
			branches = DefaultBranches
		}
		if len(branches) > 0 {
			branch = branches[d.hash("branch", agent, issueKey, attempt)%uint64(len(branches))]
		}
	}
	if d.Duration > 0 {
		took = d.Duration/2 + time.Duration(d.hash("duration", agent, issueKey, attempt)%uint64(d.Duration+1))
	}
	return outcome, branch, took
}

// Run implements Runner.
func (d Runner) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	outcome, branch, took := d.Outcome(req.Agent, req.IssueKey, req.Attempt)
	var acked []string
	if d.Followups && req.Mailbox != nil {
		acked = readFollowups(ctx, req.Mailbox, time.Now().Add(took))
	} else if took > 0 {
		t := time.NewTimer(took)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if ctx.Err() != nil {
		return runners.Result{}, fmt.Errorf("demo runner: cancelled: %w", context.Cause(ctx))
	}
	res, err := d.result(req, outcome, branch)
	if err == nil && len(acked) > 0 {
		res.Delivered, res.FollowupsAcked = acked, acked
	}
	return res, err
}

// readFollowups reads the mailbox until end (each read waits well under a second for
// a follow-up) and returns the ids of the follow-ups read.
func readFollowups(ctx context.Context, mb runners.Mailbox, end time.Time) []string {
	var ids []string
	for ctx.Err() == nil && time.Now().Before(end) {
		start := time.Now()
		fs, err := mb.Next(ctx)
		for _, f := range fs {
			ids = append(ids, f.ID)
		}
		if err != nil || time.Since(start) < 10*time.Millisecond {
			// An error, or a Redis that does not block: a short pause, not a hot loop.
			select {
			case <-ctx.Done():
			case <-time.After(min(20*time.Millisecond, time.Until(end))):
			}
		}
	}
	return ids
}

// result is the outcome of a run as its agent would report it.
func (d Runner) result(req runners.RunRequest, outcome, branch string) (runners.Result, error) {
	n := d.hash("package", req.Agent, req.IssueKey, 0) % 1000
	pkg := fmt.Sprintf("demo-pkg-%03d", n)
	if req.Agent != "triage" {
		switch outcome {
		case Success:
			return runners.Result{Success: true, MergeRequestURL: fmt.Sprintf("https://gitlab.example.com/redhat/centos-stream/rpms/%s/-/merge_requests/%d",
				pkg, 1+d.hash("mr", req.Agent, req.IssueKey, req.Attempt)%9000)}, nil
		case Failure:
			return runners.Result{Success: false, Error: fmt.Sprintf("demo: %s of %s failed to build (attempt %d)", req.Agent, pkg, req.Attempt)}, nil
		default:
			return runners.Result{}, fmt.Errorf("%w (%s %s attempt %d)", ErrCrash, req.Agent, req.IssueKey, req.Attempt)
		}
	}
	data := map[string]any{"jira_issue": req.IssueKey}
	switch outcome {
	case runners.ResolutionRebase, runners.ResolutionBackport, runners.ResolutionRebuild:
		data["package"] = pkg
		data["justification"] = "demo: simulated triage"
		data["fix_version"] = branch
	case runners.ResolutionClarification:
		data["findings"] = "demo: the report does not say which version is affected"
		data["additional_info_needed"] = "the affected package version"
	case runners.ResolutionOpenEnded:
		data["summary"] = "demo: needs a human look"
		data["recommendation"] = "review by a maintainer"
	case runners.ResolutionPostponed:
		data["summary"] = "demo: waiting for a dependency"
		data["pending_issues"] = []string{}
	case runners.ResolutionNotAffected:
		data["justification_category"] = "vulnerable_code_not_present"
		data["explanation"] = "demo: the vulnerable code is not shipped"
		data["package"] = pkg
	case runners.ResolutionError:
		data["details"] = fmt.Sprintf("demo: triage of %s errored (attempt %d)", req.IssueKey, req.Attempt)
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return runners.Result{}, err
	}
	res := runners.Result{Resolution: outcome, Data: raw}
	if runners.IsDispatched(outcome) {
		res.TargetBranch = branch
	}
	return res, nil
}

func (d Runner) hash(salt, agent, key string, attempt int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00%s\x00%s\x00%s\x00%d", d.Seed, salt, agent, key, attempt)
	// fnv's low bits mix poorly for short inputs; fold the high half in.
	v := h.Sum64()
	return v ^ (v >> 29) ^ (v >> 47)
}

// PickWeighted chooses a key of mix with probability proportional to its weight, by h
// (a hash or a random number); "" when no weight is positive. The demo runner's outcomes
// and the demo's planned paths are both drawn with it.
func PickWeighted(mix map[string]int, h uint64) string {
	keys := make([]string, 0, len(mix))
	total := 0
	for k, w := range mix {
		if w > 0 {
			keys = append(keys, k)
			total += w
		}
	}
	if total == 0 {
		return ""
	}
	sort.Strings(keys)
	n := int(h % uint64(total))
	for _, k := range keys {
		n -= mix[k]
		if n < 0 {
			return k
		}
	}
	return keys[len(keys)-1]
}
