package inspect

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/pipeline/event"
)

// HistoryEvent is one entry about an issue in one of the pipeline's streams.
type HistoryEvent struct {
	// Time is the time of the stream id (when Redis appended the entry).
	Time   time.Time `json:"time"`
	Stream string    `json:"stream"`
	ID     string    `json:"id"`
	Kind   string    `json:"kind"` // input, results or dead
	// EventType is the envelope's event_type (requests of Python producers, which
	// carry none, get the agent's request type); "dead" for dead letters.
	EventType     string `json:"event_type"`
	Agent         string `json:"agent,omitempty"`
	Issue         string `json:"issue"`
	Fence         string `json:"fence,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	CausationID   string `json:"causation_id,omitempty"`
	ReplayOf      string `json:"replay_of,omitempty"`
	// About is the input entry a results record or a dead letter is about
	// ("stream id").
	About string `json:"about,omitempty"`
	// Detail: a result's outcome, a conflict's reason and the other entry, a dead
	// letter's error.
	Detail string `json:"detail,omitempty"`
	// Reason is a lock.dropped or lock.coalesced record's reason: "locked" (it met a
	// live holder) or "superseded" (it entered its stream before another entry's run of
	// the issue ended); OtherEntry is that other entry's id, and Holder and HolderFence
	// the live holder a "locked" one met.
	Reason      string `json:"reason,omitempty"`
	OtherEntry  string `json:"other_entry,omitempty"`
	Holder      string `json:"holder,omitempty"`
	HolderFence string `json:"holder_fence,omitempty"`
}

// History returns every entry about issue in every stream of the topology (inputs,
// results and dead letters), ordered by their stream ids: by time, then sequence,
// then stream name.
//
// Cost: every stream is read whole, with XRANGE in pages of PageSize, the next pages of
// all streams pipelined together: ceil(longest stream / PageSize) round trips, and the
// transfer of every entry of every stream; the issue is matched on the client. Streams
// are capped by MAX_LEN, which bounds it.
func (in *Inspector) History(ctx context.Context, issue string) ([]HistoryEvent, error) {
	key, err := in.locker.Canonicalize(issue)
	if err != nil {
		return nil, err
	}
	type src struct {
		stream, kind string
		route        event.Route
	}
	var srcs []src
	for _, r := range in.topo.AllInputs() {
		srcs = append(srcs, src{r.Stream, KindInput, r})
	}
	srcs = append(srcs, src{stream: in.topo.Results(), kind: KindResults}, src{stream: in.topo.Dead(), kind: KindDead})

	var out []HistoryEvent
	err = in.scan(ctx, len(srcs), func(i int) string { return srcs[i].stream }, "-", "+",
		func(i int, m redis.XMessage) {
			s := srcs[i]
			raw := event.EntryIssue(s.stream, m.ID, m.Values)
			if k, _ := in.canonical(raw); k != key {
				return
			}
			out = append(out, historyEvent(s.stream, s.kind, s.route, m, key))
		})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(a, b int) bool {
		if c := streamid.Compare(out[a].ID, out[b].ID); c != 0 {
			return c < 0
		}
		return out[a].Stream < out[b].Stream
	})
	return out, nil
}

func historyEvent(stream, kind string, route event.Route, m redis.XMessage, key string) HistoryEvent {
	v := func(k string) string { return fieldStr(m.Values[k]) }
	ev := HistoryEvent{Time: streamid.Time(m.ID), Stream: stream, ID: m.ID, Kind: kind, Issue: key}
	_, hasPayload := m.Values[event.FieldPayload]
	_, hasUUID := m.Values[event.FieldUUID]
	if !hasPayload && !hasUUID {
		// A results record: plain fields.
		ev.EventType, ev.Agent, ev.Fence, ev.CorrelationID = v("event_type"), v("agent"), v("fence"), v("correlation_id")
		if v("message_id") != "" || v("stream") != "" {
			ev.About = strings.TrimSpace(v("stream") + " " + v("message_id"))
		}
		var d []string
		for _, f := range []string{"outcome", "detail"} {
			if v(f) != "" {
				d = append(d, v(f))
			}
		}
		if c := conflictDetail(v); c != "" {
			ev.Reason, ev.OtherEntry = v("reason"), v("holder_message_id")
			ev.Holder, ev.HolderFence = v("holder"), v("holder_fence")
			d = append(d, c)
		}
		ev.Detail = strings.Join(d, "; ")
		return ev
	}
	msg := event.DecodeEntry(stream, m.ID, m.Values)
	md := msg.Metadata.Get
	ev.EventType, ev.Fence, ev.CorrelationID = md(event.MetaEventType), md(event.MetaFence), md(event.MetaCorrelationID)
	ev.CausationID, ev.ReplayOf = md(event.MetaCausationID), md(event.MetaReplayOf)
	ev.Agent = route.Agent
	if ev.EventType == "" && route.Agent != "" {
		ev.EventType = event.RequestedEvent(route.Agent)
	}
	if kind == KindDead {
		orig := ev.EventType
		ev.EventType = event.Dead
		ev.Agent = v(event.DeadFieldAgent)
		ev.About = strings.TrimSpace(v(event.DeadFieldStream) + " " + v(event.DeadFieldID))
		ev.Detail = fmt.Sprintf("%s after %s attempt(s): %s", orig, v(event.DeadFieldAttempts), v(event.DeadFieldError))
	}
	return ev
}

// conflictDetail says why a lock.dropped or lock.coalesced record's entry did not run,
// naming the other entry; "" for other records. A superseded record names no holder
// (the run that superseded it had ended), so "held by" would be false.
func conflictDetail(v func(string) string) string {
	holder, fence, other := v("holder"), v("holder_fence"), v("holder_message_id")
	if holder == "" && other == "" {
		return ""
	}
	entry := other
	if entry == "" {
		entry = "unknown" // a lease taken without a message id (by hand, or an old worker)
	}
	var d string
	switch {
	case v("reason") == "superseded":
		d = "superseded by entry " + entry + ", whose run of the issue ended after this one was queued"
	case v("event_type") == event.LockCoalesced:
		d = fmt.Sprintf("queued behind entry %s, held by %s (fence %s); runs once it is released", entry, holder, fence)
	default:
		d = fmt.Sprintf("held by %s (fence %s) for entry %s", holder, fence, entry)
	}
	if v("replaced") == "true" {
		d += "; replaced the event queued before it"
	}
	return d
}

// scan reads streams 0..n-1 from start to end (inclusive bounds as XRANGE takes them)
// in pages of PageSize, the next pages of all unfinished streams pipelined in one round
// trip, and calls fn for each entry in stream order.
func (in *Inspector) scan(ctx context.Context, n int, stream func(int) string, start, end string, fn func(int, redis.XMessage)) error {
	next := make([]string, n)
	todo := map[int]bool{}
	for i := range n {
		next[i] = start
		todo[i] = true
	}
	for len(todo) > 0 {
		pipe := in.rdb.Pipeline()
		cmds := map[int]*redis.XMessageSliceCmd{}
		for i := range todo {
			cmds[i] = pipe.XRangeN(ctx, stream(i), next[i], end, in.page)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("xrange: %w", err)
		}
		for i := range n {
			c, ok := cmds[i]
			if !ok {
				continue
			}
			page, err := c.Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("xrange %s: %w", stream(i), err)
			}
			for _, m := range page {
				fn(i, m)
			}
			if int64(len(page)) < in.page {
				delete(todo, i)
				continue
			}
			next[i] = "(" + page[len(page)-1].ID
		}
	}
	return nil
}
