package event

import (
	"encoding/json"
	"strconv"
	"time"
)

// Worker presence: each router says, every PresenceInterval, which consumers it reads as,
// so that the operator's views can tell a live idle worker from a dead one and show a new
// worker before its first entry. XINFO CONSUMERS cannot: a consumer's idle time grows the
// same whether it waits on an empty stream or died, and a consumer exists only once it
// has read.
//
// The record is one sorted set per namespace (Topology.Workers): a member per
// subscription, the JSON of a WorkerBeat, scored with the time (ms, Redis's clock) until
// which the beat vouches for it. Redis's clock, not the worker's, so that the console on
// another host compares like with like. A router that stops cleanly removes its members;
// one that dies leaves them to expire (and to be pruned an hour later).
const (
	// PresenceInterval is how often a router renews its presence.
	PresenceInterval = 2 * time.Second
	// PresenceTTL is how long one beat vouches for a worker: several intervals, so a
	// slow round trip or a GC pause does not make a live worker look dead.
	PresenceTTL = 5 * PresenceInterval
)

// WorkerBeat is one subscription's presence record (the member's JSON).
type WorkerBeat struct {
	Consumer string `json:"consumer"`
	Stream   string `json:"stream"`
	Group    string `json:"group"`
	Agent    string `json:"agent"`
	Branch   string `json:"branch,omitempty"`
	Host     string `json:"host"`
	PID      int    `json:"pid"`
	// Started is when the process's router started (unix ms): a restarted process
	// with the same consumer name is a new member.
	Started int64 `json:"started_ms"`
	// Drain is its drain state (DrainDraining, DrainDrained; "" while it works), and
	// DrainReason the standing request's reason: a change makes a new member, which
	// replaces the old one in the beat that reports it.
	Drain       string `json:"drain,omitempty"`
	DrainReason string `json:"drain_reason,omitempty"`
}

// Workers is the key of the namespace's worker presence set.
func (t Topology) Workers() string { return t.ns() + ":workers" }

// DecodeWorkerBeat parses a member of Topology.Workers; ok is false for a member this
// version cannot read.
func DecodeWorkerBeat(member string) (WorkerBeat, bool) {
	var b WorkerBeat
	if err := json.Unmarshal([]byte(member), &b); err != nil || b.Consumer == "" {
		return WorkerBeat{}, false
	}
	return b, true
}

// String names the beat's process for operators: "host pid 123".
func (b WorkerBeat) String() string { return b.Host + " pid " + strconv.Itoa(b.PID) }
