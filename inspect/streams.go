package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stream kinds.
const (
	KindInput   = "input"
	KindResults = "results"
	KindDead    = "dead"
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
	// cannot tell (entries deleted inside the range).
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
	// Idle is the time since the consumer last read or claimed.
	Idle time.Duration `json:"-"`
}

// MarshalJSON adds idle_ms.
func (c ConsumerInfo) MarshalJSON() ([]byte, error) {
	type plain ConsumerInfo
	return json.Marshal(struct {
		plain
		IdleMS int64 `json:"idle_ms"`
	}{plain(c), c.Idle.Milliseconds()})
}

// Streams returns every stream of the topology that exists (the input streams with
// their :todo twins, then results and dead), with length, first and last ids, and
// each consumer group's lag, pending count and consumers with their idle times.
//
// Cost: two round trips: XINFO STREAM and XINFO GROUPS of every stream pipelined,
// then XINFO CONSUMERS of every group pipelined.
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
	if _, err := pipe.Exec(ctx); err != nil && !isNoSuchKeyErr(err) && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("xinfo: %w", err)
	}
	var out []StreamInfo
	type gref struct{ s, g int }
	var grefs []gref
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
			s.Groups = append(s.Groups, GroupInfo{Name: g.Name, Lag: g.Lag, Pending: g.Pending,
				LastDeliveredID: g.LastDeliveredID, EntriesRead: g.EntriesRead, Consumers: []ConsumerInfo{}})
			grefs = append(grefs, gref{len(out), len(s.Groups) - 1})
		}
		out = append(out, s)
	}
	if len(grefs) == 0 {
		return out, nil
	}
	pipe = in.rdb.Pipeline()
	cons := make([]*redis.XInfoConsumersCmd, len(grefs))
	for k, r := range grefs {
		cons[k] = pipe.XInfoConsumers(ctx, out[r.s].Stream, out[r.s].Groups[r.g].Name)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNoSuchKeyErr(err) && !isNoGroupErr(err) {
		return nil, fmt.Errorf("xinfo consumers: %w", err)
	}
	for k, r := range grefs {
		cs, err := cons[k].Result()
		if err != nil && !isNoSuchKeyErr(err) && !isNoGroupErr(err) {
			return nil, fmt.Errorf("xinfo consumers %s %s: %w", out[r.s].Stream, out[r.s].Groups[r.g].Name, err)
		}
		g := &out[r.s].Groups[r.g]
		for _, c := range cs {
			g.Consumers = append(g.Consumers, ConsumerInfo{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
		}
	}
	return out, nil
}
