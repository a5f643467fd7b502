package event

import (
	"fmt"
	"slices"
)

// Agents, in pipeline order, and the CentOS Stream branches downstream agents serve.
var (
	Agents   = []string{"triage", "rebase", "backport", "rebuild"}
	Branches = []string{"c9s", "c10s"}
)

// DefaultNamespace prefixes every stream of a Topology whose Namespace is empty.
const DefaultNamespace = "ymir"

// Topology maps agents and branches to streams and consumer groups, and names every
// other key of the pipeline (docs/architecture.md, "Streams and groups").
type Topology struct {
	// Namespace prefixes every stream and key ("ymir:triage"), so that several
	// pipelines can share one Redis. Default: DefaultNamespace ("ymir").
	Namespace string
}

// Route is one input of an agent: a stream and the group that reads it.
type Route struct {
	Agent, Branch string
	Todo          bool // the :todo twin for user-triggered work
	Stream, Group string
}

// CheckAgent validates an (agent, branch) pair.
func CheckAgent(agent, branch string) error {
	if !slices.Contains(Agents, agent) {
		return fmt.Errorf("unknown agent %q (want one of %v)", agent, Agents)
	}
	if agent == "triage" {
		if branch != "" {
			return fmt.Errorf("agent triage takes no branch (got %q)", branch)
		}
		return nil
	}
	if !slices.Contains(Branches, branch) {
		return fmt.Errorf("agent %s needs a branch, one of %v (got %q)", agent, Branches, branch)
	}
	return nil
}

func (t Topology) ns() string {
	if t.Namespace == "" {
		return DefaultNamespace
	}
	return t.Namespace
}

// Stream is the stream of (agent, branch), or its :todo twin.
func (t Topology) Stream(agent, branch string, todo bool) string {
	s := t.ns() + ":" + agent
	if branch != "" {
		s += ":" + branch
	}
	if todo {
		s += ":todo"
	}
	return s
}

// Group is the consumer group of (agent, branch): "triage", "rebase-c9s", ...
func (t Topology) Group(agent, branch string) string {
	if branch == "" {
		return agent
	}
	return agent + "-" + branch
}

// Inputs are the streams an (agent, branch) worker reads: the :todo twin first, then
// the main stream.
func (t Topology) Inputs(agent, branch string) []Route {
	var rs []Route
	for _, todo := range []bool{true, false} {
		rs = append(rs, Route{Agent: agent, Branch: branch, Todo: todo,
			Stream: t.Stream(agent, branch, todo), Group: t.Group(agent, branch)})
	}
	return rs
}

// AllInputs are the input routes of every agent and branch.
func (t Topology) AllInputs() []Route {
	rs := t.Inputs("triage", "")
	for _, a := range Agents[1:] {
		for _, b := range Branches {
			rs = append(rs, t.Inputs(a, b)...)
		}
	}
	return rs
}

// Results is the append-only log of outcomes.
func (t Topology) Results() string { return t.ns() + ":results" }

// Dead is the dead-letter stream.
func (t Topology) Dead() string { return t.ns() + ":dead" }

// Audit is the operators' audit trail (internal/audit): who wrote what, why and when.
// It is "<namespace>-audit", outside "<namespace>:*", so that a Redis ACL that lets the
// workers write every pipeline key does not let them write or delete the trail
// (deploy/base/secrets.yaml).
func (t Topology) Audit() string { return t.ns() + "-audit" }

// Queued is the key of an issue's queued marker for agent:
// "<namespace>:queued:<agent>:<KEY>" (issue canonical). It holds "<entry id> <stream>
// <message UUID>" of the last request published for the issue to that agent's streams; the
// UUID may be left out, but then an entry of the stream deleted and created again that
// took the same id (same millisecond) passes for the request. The fetcher writes the
// triage markers; a producer of downstream requests may write the others (SET with a TTL
// after its XADD), and the fetcher then also leaves alone a stale issue whose downstream
// request still waits.
func (t Topology) Queued(agent, issue string) string {
	return t.ns() + ":queued:" + agent + ":" + issue
}

// QueuedBeside is the Redis Cluster form of Queued: one marker per stream, in the
// stream's hash slot ("{<stream>}:queued:<agent>:<KEY>"), so that one script can check
// the marker and append to the stream. Same value as Queued's.
func (t Topology) QueuedBeside(stream, agent, issue string) string {
	return "{" + stream + "}:queued:" + agent + ":" + issue
}

// LockScope is the lockmw scope of this namespace: none for the default namespace (keys
// compatible with the Python agents), "<ns>:" otherwise.
func (t Topology) LockScope() string {
	if t.ns() == DefaultNamespace {
		return ""
	}
	return t.ns() + ":"
}

// RouteOf finds the route of a stream name.
func (t Topology) RouteOf(stream string) (Route, bool) {
	for _, r := range t.AllInputs() {
		if r.Stream == stream {
			return r, true
		}
	}
	return Route{}, false
}

// ConsumerClaimKey is the key of the claim on consumer in group.
func (t Topology) ConsumerClaimKey(group, consumer string) string {
	return t.ns() + ":consumer:" + group + ":" + consumer
}

// Workers is the key of the namespace's worker presence set.
func (t Topology) Workers() string { return t.ns() + ":workers" }

// Drains is the key of the namespace's standing drain requests (a hash).
func (t Topology) Drains() string { return t.ns() + ":drain" }
