package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The operators' pause and resume (issue 38): audited writes on lease.Pauses, and the
// list the CLI, the console's banner and the views show.

// Pause and resume actions, as the audit trail names them.
const (
	ActionPause  = "pause"
	ActionResume = "resume"
)

// PauseScope parses and checks a pause scope: agent:<agent>[/<branch>] (a known agent,
// and a branch only for a downstream agent), issue:<KEY> or field:<path>=<value>.
func (in *Inspector) PauseScope(raw string) (lease.PauseScope, error) {
	sc, err := in.locker.ParsePauseScope(raw)
	if err != nil {
		return sc, err
	}
	if sc.Agent != "" {
		if !slices.Contains(event.Agents, sc.Agent) {
			return sc, fmt.Errorf("%w: unknown agent %q (want one of %v)", lease.ErrBadPauseScope, sc.Agent, event.Agents)
		}
		if sc.Branch != "" {
			if err := event.CheckAgent(sc.Agent, sc.Branch); err != nil || sc.Agent == "triage" {
				return sc, fmt.Errorf("%w: %s has no branch %q (branches: %v, downstream agents only)", lease.ErrBadPauseScope, sc.Agent, sc.Branch, event.Branches)
			}
		}
	}
	return sc, nil
}

// Paused is what Pause did: the pause, and the runs of its scope that were live when
// it was written (they may still finish: they passed their pause check before it).
// With StopRunning their leases were force-released: each run is cancelled and its
// event, redelivered, parks.
type Paused struct {
	Pause   lease.Pause    `json:"pause"`
	New     bool           `json:"new"`
	Running []LeaseInfo    `json:"running"`
	Stopped []LeaseInfo    `json:"stopped,omitempty"`
	Parked  []lease.Parked `json:"parked,omitempty"`
}

// Pause pauses scope (PauseScope's syntax) for the operator of ctx: no run starts in
// it until Resume; its events wait in order. It lists the leases of the scope live
// after the pause was written (every run that can still be under way in it) and, with
// stopRunning, force-releases them. An audited write.
func (in *Inspector) Pause(ctx context.Context, raw string, stopRunning bool) (out Paused, err error) {
	sc, err := in.PauseScope(raw)
	if err != nil {
		return Paused{}, err
	}
	name := sc.String()
	var issues []string
	if sc.Issue != "" {
		issues = []string{sc.Issue}
	}
	scope := name
	if stopRunning {
		scope += " stop-running"
	}
	op := audit.OperatorFrom(ctx)
	err = in.write(ctx, ActionPause, scope, issues, func(ctx context.Context) error {
		pa := lease.Pause{Scope: name, Reason: op.Reason, By: op.Who, At: in.now(), StopRunning: stopRunning}
		created, err := in.locker.Pauses().Set(ctx, pa)
		if err != nil {
			return err
		}
		out = Paused{Pause: pa, New: created}
		// After the pause is written: every run that passed its check before it holds
		// its lease now (lease/pause.go).
		if out.Running, err = in.leasesIn(ctx, sc); err != nil {
			return err
		}
		if !stopRunning {
			return nil
		}
		for _, l := range out.Running {
			if _, err := in.locker.ForceRelease(ctx, l.Agent, l.Issue); err != nil {
				return fmt.Errorf("stop %s %s: %w", l.Agent, l.Issue, err)
			}
			out.Stopped = append(out.Stopped, l)
		}
		return nil
	})
	return out, err
}

// leasesIn lists the live agent leases in sc: by agent, branch (the stream of the
// guarded entry), issue, or field (the guarded entry's payload and metadata).
func (in *Inspector) leasesIn(ctx context.Context, sc lease.PauseScope) ([]LeaseInfo, error) {
	running, err := in.Running(ctx)
	if err != nil {
		return nil, err
	}
	var out []LeaseInfo
	for _, r := range running {
		l := r.Lease
		if l.Scope != string(lease.ScopeAgent) && l.Scope != "" {
			continue
		}
		t := lease.PauseTarget{Agent: l.Agent, Branch: r.Branch, Issue: l.Issue}
		if sc.Field != "" && r.Stream != "" {
			msgs, err := in.rdb.XRangeN(ctx, r.Stream, l.MessageID, l.MessageID, 1).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			if len(msgs) > 0 {
				msg := event.DecodeEntry(r.Stream, msgs[0].ID, msgs[0].Values)
				t.Payload, t.Meta = msg.Payload, msg.Metadata.Get
			}
		}
		if sc.Matches(t) {
			out = append(out, l)
		}
	}
	return out, nil
}

// Resumed is what Resume did.
type Resumed struct {
	Scope string `json:"scope"`
	// Found: the scope was paused. Published: its parked events appended to their
	// streams again, in stream order. Again: it was paused again meanwhile (the pause
	// stays).
	Found     bool `json:"found"`
	Published int  `json:"published"`
	Again     bool `json:"again,omitempty"`
}

// Resume ends the pause of scope for the operator of ctx: its parked events are
// appended to their streams again, in stream order, each once, then the pause ends. A
// resume that fails half way (Redis lost) is safe to repeat. An audited write.
func (in *Inspector) Resume(ctx context.Context, raw string) (out Resumed, err error) {
	sc, err := in.PauseScope(raw)
	if err != nil {
		return Resumed{}, err
	}
	name := sc.String()
	var issues []string
	if sc.Issue != "" {
		issues = []string{sc.Issue}
	}
	err = in.write(ctx, ActionResume, name, issues, func(ctx context.Context) error {
		r, err := in.locker.Pauses().Resume(ctx, name, in.maxLen)
		out = Resumed{Scope: name, Found: r.Found, Published: r.Published, Again: r.Again}
		return err
	})
	return out, err
}

// PauseList is the active pauses (the CLI's pause --list --json, /api/v1/pauses).
type PauseList struct {
	Pauses []lease.Pause `json:"pauses"`
}

// Pauses lists the active pauses, each with the number of events parked. Two round
// trips.
func (in *Inspector) Pauses(ctx context.Context) ([]lease.Pause, error) {
	return in.locker.Pauses().List(ctx)
}

// PausedBy returns the scopes of pauses that hold an event of (agent, branch, issue),
// the pauses read once by the caller. A field pause is not named: the event's
// payload is not known here.
func PausedBy(pauses []lease.Pause, parse func(string) (lease.PauseScope, error), agent, branch, issue string) []string {
	var out []string
	for _, p := range pauses {
		sc, err := parse(p.Scope)
		if err != nil {
			continue
		}
		if sc.Field == "" && sc.Matches(lease.PauseTarget{Agent: agent, Branch: branch, Issue: issue}) {
			out = append(out, p.Scope)
		}
	}
	return out
}

// ParsePause is the Inspector's pause scope parser, for PausedBy.
func (in *Inspector) ParsePause(s string) (lease.PauseScope, error) {
	return in.locker.ParsePauseScope(s)
}

// ParkedPerStream counts the events every pause holds back, per input stream: the
// console's per-agent view of paused work.
func (in *Inspector) ParkedPerStream(ctx context.Context) (map[string]int64, error) {
	pauses, err := in.Pauses(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, p := range pauses {
		if p.Waiting == 0 {
			continue
		}
		parked, err := in.locker.Pauses().Parked(ctx, p.Scope)
		if err != nil {
			return nil, err
		}
		for _, e := range parked {
			out[e.Stream]++
		}
	}
	return out, nil
}
