package inspect

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stream kinds.
const (
	KindInput   = "input"
	KindResults = "results"
	KindDead    = "dead"
	// KindAudit is an operator's write on the issue, from the audit trail.
	KindAudit = "audit"
)

// StreamInfo describes one stream of the pipeline.
type StreamInfo struct {
	Stream string `json:"stream"`
	Kind   string `json:"kind"` // input, results or dead
	Agent  string `json:"agent,omitempty"`
	Branch string `json:"branch,omitempty"`
	Todo   bool   `json:"todo"`
	Length int64  `json:"length"`
	// FirstID and LastID are the oldest and newest entries' ids ("" when empty);
	// LastGeneratedID is the last id ever added, also after trimming.
	FirstID         string      `json:"first_id"`
	LastID          string      `json:"last_id"`
	LastGeneratedID string      `json:"last_generated_id"`
	Groups          []GroupInfo `json:"groups"`
}

// GroupInfo describes one consumer group of a stream.
type GroupInfo struct {
	Name string `json:"name"`
	// Lag is the number of entries not yet delivered to the group; -1 when Redis
	// cannot tell (entries deleted inside the range, a Redis older than 7.0, or the
	// embedded miniredis, which answers the stream's length).
	Lag             int64          `json:"lag"`
	Pending         int64          `json:"pending"`
	LastDeliveredID string         `json:"last_delivered_id"`
	EntriesRead     int64          `json:"entries_read"`
	Consumers       []ConsumerInfo `json:"consumers"`
}

// ConsumerInfo describes one consumer of a group.
type ConsumerInfo struct {
	Name    string `json:"name"`
	Pending int64  `json:"pending"`
	// Idle is the time since the consumer last read or claimed; negative when the
	// server does not say (the embedded miniredis) or the consumer has not read yet
	// (known only from its presence).
	Idle time.Duration `json:"-"`
	// State is ConsumerAlive, ConsumerDead or ConsumerNoBeat, from the worker's
	// presence beats: an idle consumer of a live process is alive.
	State string `json:"state"`
	// Drain is a live worker's drain state (drainreq.Draining, drainreq.Drained),
	// empty while it takes work.
	Drain string `json:"drain,omitempty"`
	// Process names the consumer's process ("host pid 123") when it reports its
	// presence; LastSeen is its last beat.
	Process  string     `json:"process,omitempty"`
	LastSeen *time.Time `json:"last_seen,omitempty"`
}

// MarshalJSON adds idle_ms (-1: unknown).
func (c ConsumerInfo) MarshalJSON() ([]byte, error) {
	type plain ConsumerInfo
	idle := c.Idle.Milliseconds()
	if c.Idle < 0 {
		idle = -1
	}
	return json.Marshal(struct {
		plain
		IdleMS int64 `json:"idle_ms"`
	}{plain(c), idle})
}

// Streams returns every stream of the topology that exists (the input streams with
// their :todo twins, then results and dead), with length, first and last ids, and
// each consumer group's lag, pending count and consumers with their idle times and
// states (alive, dead, no heartbeat). A consumer whose worker reports its presence
// but has not read yet is listed too, with an unknown idle time.
//
// Cost: two round trips: XINFO STREAM and XINFO GROUPS of every stream and the
// workers' presence pipelined, then XINFO CONSUMERS of every group pipelined; and
// once per Inspector, INFO server (the embedded miniredis answers no lag and no idle
// times: they are reported unknown rather than wrong).
func (in *Inspector) Streams(ctx context.Context) ([]StreamInfo, error) {
	var all []StreamInfo
	for _, r := range in.topo.AllInputs() {
		all = append(all, StreamInfo{Stream: r.Stream, Kind: KindInput, Agent: r.Agent, Branch: r.Branch, Todo: r.Todo})
	}
	all = append(all, StreamInfo{Stream: in.topo.Results(), Kind: KindResults},
		StreamInfo{Stream: in.topo.Dead(), Kind: KindDead})

	pipe := in.rdb.Pipeline()
	infos := make([]*redis.XInfoStreamCmd, len(all))
	groups := make([]*redis.XInfoGroupsCmd, len(all))
	for i, s := range all {
		infos[i] = pipe.XInfoStream(ctx, s.Stream)
		groups[i] = pipe.XInfoGroups(ctx, s.Stream)
	}
	readPresence := in.queuePresence(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil && !isNoSuchKeyErr(err) && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("xinfo: %w", err)
	}
	pres, err := readPresence()
	if err != nil {
		return nil, err
	}
	embedded := in.server(ctx).Embedded()
	var out []StreamInfo
	var grefs []groupRef
	for i, s := range all {
		info, err := infos[i].Result()
		if isNoSuchKeyErr(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("xinfo stream %s: %w", s.Stream, err)
		}
		gs, err := groups[i].Result()
		if err != nil && !isNoSuchKeyErr(err) {
			return nil, fmt.Errorf("xinfo groups %s: %w", s.Stream, err)
		}
		s.Length, s.LastGeneratedID = info.Length, info.LastGeneratedID
		s.FirstID, s.LastID = info.FirstEntry.ID, info.LastEntry.ID
		s.Groups = []GroupInfo{}
		for _, g := range gs {
			if embedded {
				g.Lag = -1
			}
			s.Groups = append(s.Groups, GroupInfo{Name: g.Name, Lag: g.Lag, Pending: g.Pending,
				LastDeliveredID: g.LastDeliveredID, EntriesRead: g.EntriesRead, Consumers: []ConsumerInfo{}})
			grefs = append(grefs, groupRef{len(out), len(s.Groups) - 1})
		}
		out = append(out, s)
	}
	if len(grefs) == 0 {
		return out, nil
	}
	if err := in.readConsumers(ctx, out, grefs, pres, embedded); err != nil {
		return nil, err
	}
	return out, nil
}

// groupRef names group out[s].Groups[g] of Streams' report.
type groupRef struct{ s, g int }

// readConsumers is Streams' second round trip: XINFO CONSUMERS of the groups refs
// name, pipelined, filed in out with each consumer's state.
func (in *Inspector) readConsumers(ctx context.Context, out []StreamInfo, refs []groupRef, pres presence, embedded bool) error {
	pipe := in.rdb.Pipeline()
	cons := make([]*redis.XInfoConsumersCmd, len(refs))
	for k, r := range refs {
		cons[k] = pipe.XInfoConsumers(ctx, out[r.s].Stream, out[r.s].Groups[r.g].Name)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNoSuchKeyErr(err) && !isNoGroupErr(err) {
		return fmt.Errorf("xinfo consumers: %w", err)
	}
	for k, r := range refs {
		cs, err := cons[k].Result()
		if err != nil && !isNoSuchKeyErr(err) && !isNoGroupErr(err) {
			return fmt.Errorf("xinfo consumers %s %s: %w", out[r.s].Stream, out[r.s].Groups[r.g].Name, err)
		}
		fillConsumers(&out[r.s].Groups[r.g], out[r.s].Stream, cs, pres, embedded)
	}
	return nil
}

// fillConsumers lists g's consumers cs, and the live workers of g that reported their
// presence before their first read, by name.
func fillConsumers(g *GroupInfo, stream string, cs []redis.XInfoConsumer, pres presence, embedded bool) {
	seen := map[string]bool{}
	for _, c := range cs {
		if embedded || c.Idle < 0 {
			c.Idle = -time.Millisecond
		}
		seen[c.Name] = true
		g.Consumers = append(g.Consumers, consumerInfo(pres, stream, g.Name, c.Name, c.Pending, c.Idle))
	}
	// A worker that reported its presence before its first read is shown at once.
	for ref, w := range pres.workers {
		if ref.stream == stream && ref.group == g.Name && !seen[ref.consumer] && w.Alive {
			g.Consumers = append(g.Consumers, consumerInfo(pres, ref.stream, ref.group, ref.consumer, 0, -time.Millisecond))
		}
	}
	slices.SortFunc(g.Consumers, func(a, b ConsumerInfo) int { return cmp.Compare(a.Name, b.Name) })
}

func consumerInfo(p presence, stream, group, name string, pending int64, idle time.Duration) ConsumerInfo {
	c := ConsumerInfo{Name: name, Pending: pending, Idle: idle}
	state, w := p.state(stream, group, name)
	c.State = state
	if w != nil {
		seen := w.LastSeen
		c.Process, c.LastSeen = w.String(), &seen
		if w.Alive {
			c.Drain = w.Drain
		}
	}
	return c
}
