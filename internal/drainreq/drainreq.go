package drainreq

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/event"
)

// Drain states a subscription reports in presence.Beat.Drain ("" while it works).
const (
	// Draining: asked to drain; it reads nothing new and claims nothing, and its
	// running event, or its entries read ahead still to be given back, are not done yet.
	Draining = "draining"
	// Drained: nothing runs, nothing is read ahead, nothing is read or claimed.
	Drained = "drained"
)

// Target names the workers a drain request is for: every worker (All), those of
// an agent (Agent, and Branch if set: else every branch), or one worker by its consumer
// name (Worker: a process's CONSUMER_NAME, or one subscription's "<name>-<i>").
type Target struct {
	All    bool   `json:"all,omitempty"`
	Agent  string `json:"agent,omitempty"`
	Branch string `json:"branch,omitempty"`
	Worker string `json:"worker,omitempty"`
}

// ErrTarget is returned for a drain target that names no workers, or names them twice over.
var ErrTarget = errors.New("a drain names --all, --agent A [--branch B], or --worker NAME")

// Check validates the target: exactly one of All, Agent, Worker; a known agent and
// branch.
func (t Target) Check() error {
	n := 0
	for _, set := range []bool{t.All, t.Agent != "", t.Worker != ""} {
		if set {
			n++
		}
	}
	if n != 1 || (t.Branch != "" && t.Agent == "") {
		return ErrTarget
	}
	if t.Agent == "" {
		if strings.ContainsAny(t.Worker, " \t\n:") {
			return fmt.Errorf("%w: worker name %q has a space or a colon", ErrTarget, t.Worker)
		}
		return nil
	}
	branch := t.Branch
	if branch == "" && t.Agent != "triage" {
		branch = event.Branches[0] // every branch: any one checks the agent
	}
	if err := event.CheckAgent(t.Agent, branch); err != nil {
		return fmt.Errorf("%w: %w", ErrTarget, err)
	}
	return nil
}

// Field is the target's field in event.Topology.Drains: "all", "agent:A", "agent:A:B",
// "worker:NAME".
func (t Target) Field() string {
	switch {
	case t.All:
		return "all"
	case t.Agent != "" && t.Branch != "":
		return "agent:" + t.Agent + ":" + t.Branch
	case t.Agent != "":
		return "agent:" + t.Agent
	}
	return "worker:" + t.Worker
}

// String is the target as an operator reads it (and the audit trail's scope).
func (t Target) String() string {
	switch {
	case t.All:
		return "all workers"
	case t.Agent != "" && t.Branch != "":
		return "agent=" + t.Agent + " branch=" + t.Branch
	case t.Agent != "":
		return "agent=" + t.Agent
	}
	return "worker=" + t.Worker
}

// parseField reads a field of event.Topology.Drains back; ok is false for one this
// version does not know.
func parseField(f string) (Target, bool) {
	kind, rest, _ := strings.Cut(f, ":")
	var t Target
	switch kind {
	case "all":
		t.All = rest == ""
	case "agent":
		t.Agent, t.Branch, _ = strings.Cut(rest, ":")
	case "worker":
		t.Worker = rest
	}
	return t, t.Check() == nil
}

// Matches reports whether the target names the subscription reading as consumer in a
// router of (agent, branch) whose process's consumer name is base.
func (t Target) Matches(agent, branch, base, consumer string) bool {
	switch {
	case t.All:
		return true
	case t.Agent != "":
		return t.Agent == agent && (t.Branch == "" || t.Branch == branch)
	}
	return t.Worker != "" && (t.Worker == base || t.Worker == consumer)
}

// Request is one standing drain request: its target, who asked, why and when.
type Request struct {
	Target Target    `json:"target"`
	Who    string    `json:"who"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// Encode is the request's value in event.Topology.Drains.
func (r Request) Encode() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// Decode reads the hash event.Topology.Drains (field → value); fields or values this
// version cannot read are left out, so a newer operator's request never stops an older
// worker.
func Decode(h map[string]string) []Request {
	out := make([]Request, 0, len(h))
	for f, v := range h {
		t, ok := parseField(f)
		if !ok {
			continue
		}
		var r Request
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			r = Request{}
		}
		r.Target = t // the field is the truth: the value is for people
		out = append(out, r)
	}
	return out
}
