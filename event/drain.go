package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Worker drain (docs/operations.md, "Maintenance and upgrades: drain"): an operator asks
// some workers to take no new work. The requests are one hash per namespace
// (Topology.Drains): a field per target (DrainTarget.Field), its value the JSON of a
// DrainRequest. Every router reads it with each presence beat, and a worker started
// while a request for it stands starts drained; each subscription reports its drain
// state in its presence record (WorkerBeat.Drain).

// Drain states a subscription reports in WorkerBeat.Drain ("" while it works).
const (
	// DrainDraining: asked to drain; it reads nothing new and claims nothing, and its
	// running event, or its entries read ahead still to be given back, are not done yet.
	DrainDraining = "draining"
	// DrainDrained: nothing runs, nothing is read ahead, nothing is read or claimed.
	DrainDrained = "drained"
)

// DrainTarget names the workers a drain request is for: every worker (All), those of
// an agent (Agent, and Branch if set: else every branch), or one worker by its consumer
// name (Worker: a process's CONSUMER_NAME, or one subscription's "<name>-<i>").
type DrainTarget struct {
	All    bool   `json:"all,omitempty"`
	Agent  string `json:"agent,omitempty"`
	Branch string `json:"branch,omitempty"`
	Worker string `json:"worker,omitempty"`
}

// ErrDrainTarget is returned for a drain target that names no workers, or names them twice over.
var ErrDrainTarget = errors.New("a drain names --all, --agent A [--branch B], or --worker NAME")

// Check validates the target: exactly one of All, Agent, Worker; a known agent and
// branch.
func (t DrainTarget) Check() error {
	n := 0
	for _, set := range []bool{t.All, t.Agent != "", t.Worker != ""} {
		if set {
			n++
		}
	}
	if n != 1 || (t.Branch != "" && t.Agent == "") {
		return ErrDrainTarget
	}
	if t.Agent == "" {
		if strings.ContainsAny(t.Worker, " \t\n:") {
			return fmt.Errorf("%w: worker name %q has a space or a colon", ErrDrainTarget, t.Worker)
		}
		return nil
	}
	branch := t.Branch
	if branch == "" && t.Agent != "triage" {
		branch = Branches[0] // every branch: any one checks the agent
	}
	if err := CheckAgent(t.Agent, branch); err != nil {
		return fmt.Errorf("%w: %w", ErrDrainTarget, err)
	}
	return nil
}

// Field is the target's field in Topology.Drains: "all", "agent:A", "agent:A:B",
// "worker:NAME".
func (t DrainTarget) Field() string {
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
func (t DrainTarget) String() string {
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

// ParseDrainField reads a field of Topology.Drains back; ok is false for one this
// version does not know.
func ParseDrainField(f string) (DrainTarget, bool) {
	kind, rest, _ := strings.Cut(f, ":")
	var t DrainTarget
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
func (t DrainTarget) Matches(agent, branch, base, consumer string) bool {
	switch {
	case t.All:
		return true
	case t.Agent != "":
		return t.Agent == agent && (t.Branch == "" || t.Branch == branch)
	}
	return t.Worker != "" && (t.Worker == base || t.Worker == consumer)
}

// DrainRequest is one standing drain request: its target, who asked, why and when.
type DrainRequest struct {
	Target DrainTarget `json:"target"`
	Who    string      `json:"who"`
	Reason string      `json:"reason"`
	At     time.Time   `json:"at"`
}

// Encode is the request's value in Topology.Drains.
func (r DrainRequest) Encode() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// DecodeDrains reads the hash Topology.Drains (field → value); fields or values this
// version cannot read are left out, so a newer operator's request never stops an older
// worker.
func DecodeDrains(h map[string]string) []DrainRequest {
	out := make([]DrainRequest, 0, len(h))
	for f, v := range h {
		t, ok := ParseDrainField(f)
		if !ok {
			continue
		}
		var r DrainRequest
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			r = DrainRequest{}
		}
		r.Target = t // the field is the truth: the value is for people
		out = append(out, r)
	}
	return out
}

// Drains is the key of the namespace's standing drain requests (a hash).
func (t Topology) Drains() string { return t.ns() + ":drain" }
