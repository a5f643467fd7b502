package presence

import (
	"encoding/json"
	"strconv"
	"time"
)

// Worker presence: each router says, every Interval, which consumers it reads as, so
// that the operator's views can tell a live idle worker from a dead one and show a new
// worker before its first entry. XINFO CONSUMERS cannot: a consumer's idle time grows the
// same whether it waits on an empty stream or died, and a consumer exists only once it
// has read.
//
// The record is one sorted set per namespace (event.Topology.Workers): a member per
// subscription, the JSON of a Beat, scored with the time (ms, Redis's clock) until
// which the beat vouches for it. Redis's clock, not the worker's, so that the console on
// another host compares like with like. A router that stops cleanly removes its members;
// one that dies leaves them to expire (and to be pruned an hour later).
const (
	// Interval is how often a router renews its presence.
	Interval = 2 * time.Second
	// TTL is how long one beat vouches for a worker: several intervals, so a
	// slow round trip or a GC pause does not make a live worker look dead.
	TTL = 5 * Interval
)

// Beat is one subscription's presence record (the member's JSON).
type Beat struct {
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
	// Drain is its drain state (drainreq.Draining, drainreq.Drained; "" while it
	// works), and DrainReason the standing request's reason: a change makes a new
	// member, which replaces the old one in the beat that reports it.
	Drain       string `json:"drain,omitempty"`
	DrainReason string `json:"drain_reason,omitempty"`
}

// Decode parses a member of event.Topology.Workers; ok is false for a member this
// version cannot read.
func Decode(member string) (Beat, bool) {
	var b Beat
	if err := json.Unmarshal([]byte(member), &b); err != nil || b.Consumer == "" {
		return Beat{}, false
	}
	return b, true
}

// String names the beat's process for operators: "host pid 123".
func (b Beat) String() string { return b.Host + " pid " + strconv.Itoa(b.PID) }
