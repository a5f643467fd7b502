package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/runners"
	"github.com/ymirflow/ymirflow/runners/demorunner"
)

// Outcomes of a downstream run, per attempt (demorunner.Success, DemoFailure,
// DemoError): short names for the catalogue.
const (
	ok    = demorunner.Success
	fail  = demorunner.Failure // {"success": false}: a clean failure
	crash = demorunner.Crash   // the runner itself fails
)

// Scenario is what the demo does with one issue: how it looks in Jira at the start, what
// the simulated agents answer at each attempt, and whether it is published twice on
// purpose.
type Scenario struct {
	// Key is the issue key, RHEL-1001 upwards; assigned by Scenarios.
	Key string `json:"key"`
	// Kind is the sample issue's shape in Jira (fresh, ymir_todo, stale, modular, ...).
	Kind fakejira.SampleKind `json:"kind"`
	// Labels, when set, replace the sample's labels (ymir_todo, when the sample had it,
	// stays last, still added by the same person).
	Labels []string `json:"labels,omitempty"`
	// Triage is the resolution the triage agent returns at attempt 1, 2, ... (the last
	// one repeats); "error" fails the attempt. Empty: the fetcher does not publish the
	// issue, so triage never sees it.
	Triage []string `json:"triage,omitempty"`
	// TargetBranch is the triage result's target branch (rhel-9.6.0 and c9s route to
	// c9s, rhel-10.1 and c10s to c10s; "" dispatches nothing).
	TargetBranch string `json:"target_branch,omitempty"`
	// Downstream is the downstream agent's outcome at attempt 1, 2, ... (the last one
	// repeats).
	Downstream []string `json:"downstream,omitempty"`
	// Enqueue publishes a downstream request by hand ("backport:c10s"), as `ymirflow
	// enqueue` would, for an issue triaged earlier; it is always published twice.
	Enqueue string `json:"enqueue,omitempty"`
	// Duplicate publishes the fetcher's triage request a second time, as a producer that
	// retried its XADD would: the lock must drop one of the two.
	Duplicate bool `json:"duplicate,omitempty"`
	// Final, when set, are the labels expected at the end (issues the fetcher leaves
	// alone or only cleans up); otherwise they follow from the plan (ExpectedLabels).
	Final []string `json:"final,omitempty"`
	// Comment: a maintainer comments on the issue in Jira while its first triage run
	// is at work, and ymirflow's own account does too. The webhook makes the
	// maintainer's comment a follow-up of the run (comment.created, delivered to its
	// mailbox); the simulated agent waits for it, acknowledges it and then answers
	// as planned. The account's own comment is never delivered.
	Comment bool `json:"comment,omitempty"`
}

// catalogue lists the scenarios in priority order: the demo with --issues N uses the
// first N (more than len(catalogue): the rest are drawn at random from the seed), so
// even a small demo shows duplicates dropped, a retry that succeeds, exhausted retries
// and a user-triggered run.
var catalogue = []Scenario{
	{Kind: fakejira.SampleFresh, Triage: []string{"backport"}, TargetBranch: "rhel-9.6.0", Downstream: []string{ok}, Duplicate: true},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebase"}, TargetBranch: "rhel-10.1", Downstream: []string{fail, ok}, Comment: true},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebuild"}, TargetBranch: "c9s", Downstream: []string{fail}},
	{Kind: fakejira.SampleTodo, Triage: []string{"rebase"}, TargetBranch: "c9s", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"error"}},
	{Kind: fakejira.SampleModular, Final: []string{}},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_backport"}, Enqueue: "backport:c10s", Downstream: []string{ok}},
	{Kind: fakejira.SampleRetry, Triage: []string{"not-affected"}},
	{Kind: fakejira.SampleStaleInFlight, Triage: []string{"rebuild"}, TargetBranch: "rhel-10.1", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"clarification-needed"}},
	{Kind: fakejira.SampleFresh, Triage: []string{"open-ended-analysis"}},
	{Kind: fakejira.SampleFresh, Triage: []string{"postponed"}},
	{Kind: fakejira.SampleTodoOutsider, Labels: []string{"ymir_triaged_not_affected"}, Final: []string{"ymir_triaged_not_affected"}},
	{Kind: fakejira.SampleFreshInFlight, Final: []string{"ymir_triage_in_progress"}},
	{Kind: fakejira.SampleModularTodo, Final: []string{}},
	{Kind: fakejira.SampleStaleTriaged, Triage: []string{"backport"}, TargetBranch: "c10s", Downstream: []string{crash, ok}},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_rebase"}, Enqueue: "rebase:c9s", Downstream: []string{ok}},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_rebuild"}, Enqueue: "rebuild:c10s", Downstream: []string{fail, ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"error", "rebase"}, TargetBranch: "rhel-9.6.0", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"backport"}, TargetBranch: "rhel-10.1", Downstream: []string{ok}, Duplicate: true},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_postponed"}, Final: []string{"ymir_triaged_postponed"}},
	{Kind: fakejira.SampleDone, Labels: []string{"ymir_triaged_backport", "ymir_backported"}, Final: []string{"ymir_triaged_backport", "ymir_backported"}},
	{Kind: fakejira.SampleTodoInProgress, Final: []string{"ymir_triage_in_progress", "ymir_todo"}},
	{Kind: fakejira.SampleRetryInFlight, Final: []string{"ymir_retry_needed", "ymir_triage_in_progress"}},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_backport"}, Enqueue: "backport:c9s", Downstream: []string{ok}},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_rebase"}, Enqueue: "rebase:c10s", Downstream: []string{fail, crash, fail}},
	{Kind: fakejira.SampleTriaged, Labels: []string{"ymir_triaged_rebuild"}, Enqueue: "rebuild:c9s", Downstream: []string{ok}},
	{Kind: fakejira.SampleTodo, Triage: []string{"backport"}, TargetBranch: "rhel-10.1", Downstream: []string{fail, ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebuild"}, TargetBranch: "c10s", Downstream: []string{ok}, Duplicate: true},
	{Kind: fakejira.SampleFresh, Triage: []string{"not-affected"}, Duplicate: true},
	{Kind: fakejira.SampleFresh, Triage: []string{"backport"}, TargetBranch: "c9s", Downstream: []string{fail, fail, ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebase"}, TargetBranch: "c9s", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebuild"}, TargetBranch: "rhel-9.6.0", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"backport"}, TargetBranch: "c10s", Downstream: []string{crash}},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebase"}, TargetBranch: "c10s", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"backport"}, TargetBranch: ""},
	{Kind: fakejira.SampleFresh, Triage: []string{"postponed"}},
	{Kind: fakejira.SampleFresh, Triage: []string{"backport"}, TargetBranch: "rhel-9.6.0", Downstream: []string{ok}},
	{Kind: fakejira.SampleFresh, Triage: []string{"open-ended-analysis"}},
	{Kind: fakejira.SampleFresh, Triage: []string{"rebase"}, TargetBranch: "rhel-10.1", Downstream: []string{crash, ok}},
}

// CatalogueSize is how many hand-written scenarios there are; a demo with more issues
// draws the rest at random.
var CatalogueSize = len(catalogue)

// firstNumber is the number of the first issue key (RHEL-1001).
const firstNumber = 1001

// Scenarios returns the plan of a demo with n issues: the first n scenarios of the
// catalogue (and random fresh issues beyond it, drawn from seed), with the keys
// RHEL-1001 upwards dealt out among them in an order drawn from seed.
func Scenarios(n int, seed int64) []Scenario {
	if n <= 0 {
		return nil
	}
	r := rand.New(rand.NewPCG(uint64(seed), 0xde70))
	out := make([]Scenario, 0, n)
	for i := 0; i < n; i++ {
		var s Scenario
		if i < len(catalogue) {
			s = catalogue[i]
			s.Labels, s.Triage, s.Downstream, s.Final = slices.Clone(s.Labels), slices.Clone(s.Triage),
				slices.Clone(s.Downstream), slices.Clone(s.Final)
		} else {
			s = randomScenario(r)
		}
		out = append(out, s)
	}
	keys := r.Perm(n)
	for i := range out {
		out[i].Key = fmt.Sprintf("RHEL-%d", firstNumber+keys[i])
	}
	slices.SortFunc(out, func(a, b Scenario) int { return strings.Compare(padKey(a.Key), padKey(b.Key)) })
	return out
}

func padKey(k string) string { return fmt.Sprintf("%12s", k) }

// randomScenario is a fresh issue with outcomes drawn like demorunner.Runner's default
// mixes.
func randomScenario(r *rand.Rand) Scenario {
	s := Scenario{Kind: fakejira.SampleFresh}
	res := demorunner.PickWeighted(demorunner.DefaultTriageMix, r.Uint64())
	if res == runners.ResolutionError {
		// An error is retried: now and then it clears on a later attempt.
		s.Triage = []string{res, demorunner.PickWeighted(map[string]int{runners.ResolutionError: 2, runners.ResolutionBackport: 1, runners.ResolutionPostponed: 1}, r.Uint64())}
		res = s.Triage[1]
	} else {
		s.Triage = []string{res}
	}
	if runners.IsDispatched(res) {
		s.TargetBranch = []string{"rhel-9.6.0", "rhel-10.1", "c9s", "c10s"}[r.IntN(4)]
		for range 3 {
			o := demorunner.PickWeighted(demorunner.DefaultDownstreamMix, r.Uint64())
			s.Downstream = append(s.Downstream, o)
			if o == ok {
				break
			}
		}
	}
	return s
}

// at returns plan[attempt-1], the last entry repeating.
func at(plan []string, attempt int) string {
	if len(plan) == 0 {
		return ""
	}
	return plan[min(max(attempt, 1), len(plan))-1]
}

// Published reports whether the fetcher publishes the issue to triage.
func (s Scenario) Published() bool { return len(s.Triage) > 0 }

// UserTriggered reports whether the issue's run is user-triggered (ymir_todo by a
// maintainer): its requests go to the :todo streams.
func (s Scenario) UserTriggered() bool { return s.Kind == fakejira.SampleTodo }

// Resolution is the triage resolution that sticks within maxRetries attempts, and the
// number of attempts triage takes; "error" when every attempt fails.
func (s Scenario) Resolution(maxRetries int) (string, int) {
	for a := 1; a <= maxRetries; a++ {
		if r := at(s.Triage, a); r != runners.ResolutionError {
			return r, a
		}
	}
	return runners.ResolutionError, maxRetries
}

// DownstreamStage returns the downstream agent and branch the issue reaches ("" when
// none).
func (s Scenario) DownstreamStage(maxRetries int) (agent, branch string) {
	if s.Enqueue != "" {
		agent, branch, _ = strings.Cut(s.Enqueue, ":")
		return agent, branch
	}
	if !s.Published() {
		return "", ""
	}
	res, _ := s.Resolution(maxRetries)
	if !runners.IsDispatched(res) || strings.TrimSpace(s.TargetBranch) == "" {
		return "", ""
	}
	return res, handlers.StreamBranch(s.TargetBranch)
}

// DownstreamAttempts returns whether the downstream agent succeeds within maxRetries
// attempts, and how many it takes.
func (s Scenario) DownstreamAttempts(maxRetries int) (succeeded bool, attempts int) {
	for a := 1; a <= maxRetries; a++ {
		if at(s.Downstream, a) == ok {
			return true, a
		}
	}
	return false, maxRetries
}

// ExpectedLabels are the ymir labels the issue should carry in Jira at the end of a
// demo whose stages make maxRetries attempts, sorted.
func (s Scenario) ExpectedLabels(maxRetries int) []string {
	var out []string
	switch {
	case s.Final != nil:
		out = slices.Clone(s.Final)
	case s.Enqueue == "" && !s.Published():
		out = slices.Clone(s.Labels)
	default:
		agent, _ := s.DownstreamStage(maxRetries)
		res, _ := s.Resolution(maxRetries)
		switch {
		case agent != "":
			if okd, _ := s.DownstreamAttempts(maxRetries); okd {
				out = []string{labels.DoneFor(agent)}
			} else {
				out = []string{labels.ErroredFor(agent)}
			}
		case res == runners.ResolutionError:
			out = []string{labels.TriageErrored}
		default:
			out = []string{handlers.ResolutionLabel(res)}
		}
	}
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return out
}

// Path describes the scenario in a few words, e.g. "fresh → backport rhel-9.6.0 → c9s:
// failure, success".
func (s Scenario) Path(maxRetries int) string {
	var b strings.Builder
	b.WriteString(string(s.Kind))
	if s.Duplicate {
		b.WriteString(" (published twice)")
	}
	if s.Comment && s.Published() {
		b.WriteString(" (a maintainer comments during triage)")
	}
	switch {
	case s.Enqueue != "":
		agent, branch, _ := strings.Cut(s.Enqueue, ":")
		fmt.Fprintf(&b, ", %s enqueued twice by hand → %s-%s: %s", agent, agent, branch, s.downstreamPath(maxRetries))
		return b.String()
	case !s.Published():
		switch s.Kind {
		case fakejira.SampleTodoOutsider:
			b.WriteString(": ymir_todo from a non-member removed")
		case fakejira.SampleModularTodo:
			b.WriteString(": modular, ymir_todo consumed")
		default:
			b.WriteString(": left alone by the fetcher")
		}
		return b.String()
	}
	res, n := s.Resolution(maxRetries)
	b.WriteString(" → triage: ")
	if res == runners.ResolutionError {
		fmt.Fprintf(&b, "error ×%d (dead)", n)
		return b.String()
	}
	if n > 1 {
		fmt.Fprintf(&b, "error ×%d, then ", n-1)
	}
	b.WriteString(res)
	agent, branch := s.DownstreamStage(maxRetries)
	switch {
	case agent != "":
		fmt.Fprintf(&b, " %s → %s-%s: %s", s.TargetBranch, agent, branch, s.downstreamPath(maxRetries))
	case runners.IsDispatched(res):
		b.WriteString(" with no target branch: nothing dispatched")
	}
	return b.String()
}

func (s Scenario) downstreamPath(maxRetries int) string {
	okd, n := s.DownstreamAttempts(maxRetries)
	var steps []string
	for a := 1; a <= n; a++ {
		step := at(s.Downstream, a)
		if step == crash {
			step = "crash" // the runner failed, rather than reporting a failure
		}
		steps = append(steps, step)
	}
	out := strings.Join(steps, ", ")
	if !okd {
		out += " (dead)"
	}
	return out
}

// Issue is the scenario's issue as the fake Jira is seeded with it.
func (s Scenario) Issue(seed int64) fakejira.Issue {
	var num int
	// Scenario keys are the demo's own constants, all of the form RHEL-<n>.
	_, _ = fmt.Sscanf(s.Key, "RHEL-%d", &num)
	is := fakejira.SampleIssue(s.Kind, num, seed)
	if s.Labels != nil {
		ls := slices.Clone(s.Labels)
		if slices.Contains(is.Labels, labels.Todo) {
			ls = append(ls, labels.Todo)
			for i := range is.Changelog {
				for j := range is.Changelog[i].Items {
					it := &is.Changelog[i].Items[j]
					if it.Field == "labels" {
						it.FromString = strings.Join(s.Labels, " ")
						it.ToString = strings.Join(ls, " ")
					}
				}
			}
		}
		is.Labels = ls
	}
	switch s.TargetBranch {
	case "rhel-9.6.0", "rhel-10.1":
		is.FixVersions = []string{s.TargetBranch}
	}
	return is
}

// planRunner is the agents of the demo: demorunner.Runner, told by each issue's
// scenario which outcome to simulate at which attempt. Issues without a scenario get
// demorunner.Runner's own seeded mix.
type planRunner struct {
	base  demorunner.Runner
	plans map[string]Scenario
	// commenting is told when the first triage run of a Comment scenario starts (the
	// demo then comments in Jira), and heard is told of each follow-up that run reads.
	commenting func(issue string)
	heard      func(issue string, f runners.Followup)
}

// followupWait bounds how long a Comment scenario's run waits for its follow-up: the
// demo's check fails when it does not come, rather than the demo hanging.
const followupWait = 30 * time.Second

func (p planRunner) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	s, known := p.plans[req.IssueKey]
	if !known {
		return p.base.Run(ctx, req)
	}
	d := p.base
	if req.Agent == "triage" {
		d.Mix = map[string]int{at(s.Triage, req.Attempt): 1}
		d.Branches = []string{s.TargetBranch}
	} else {
		d.Mix = map[string]int{at(s.Downstream, req.Attempt): 1}
	}
	var heard chan []string
	if s.Comment && req.Agent == "triage" && req.Attempt == 1 && req.Mailbox != nil && p.commenting != nil {
		// Listened for while the simulated run works, as an agent would: the comment
		// lengthens the run only if it takes longer to come than the run does.
		heard = make(chan []string, 1)
		go func() { heard <- p.awaitFollowup(ctx, req) }()
	}
	res, err := d.Run(ctx, req)
	var acked []string
	if heard != nil {
		acked = <-heard
	}
	if err == nil && len(acked) > 0 {
		// Read and acted on: acknowledged, so the handler records it delivered.
		res.Delivered, res.FollowupsAcked = acked, acked
	}
	return res, err
}

// awaitFollowup has the demo comment on the issue, then reads the run's mailbox until
// a follow-up comes (a condition, not a timer: the run holds its lease until then, so
// the comment always meets a live run), and returns the ids read.
func (p planRunner) awaitFollowup(ctx context.Context, req runners.RunRequest) []string {
	p.commenting(req.IssueKey)
	ctx, cancel := context.WithTimeout(ctx, followupWait)
	defer cancel()
	for ctx.Err() == nil {
		start := time.Now()
		fs, err := req.Mailbox.Next(ctx)
		if len(fs) > 0 {
			ids := make([]string, 0, len(fs))
			for _, f := range fs {
				ids = append(ids, f.ID)
				p.heard(req.IssueKey, f)
			}
			return ids
		}
		if err != nil || time.Since(start) < 10*time.Millisecond {
			// An error, or a Redis that does not block: a short pause, not a hot loop.
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}
