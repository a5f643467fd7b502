package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/xonce"
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
	// TraceID is the OpenTelemetry trace the entry belongs to: a record's trace_id, a
	// request's traceparent ("" when it was not traced).
	TraceID  string `json:"trace_id,omitempty"`
	ReplayOf string `json:"replay_of,omitempty"`
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
// then stream name. It is Timeline's events.
func (in *Inspector) History(ctx context.Context, issue string) ([]HistoryEvent, error) {
	rep, err := in.Timeline(ctx, issue)
	return rep.Events, err
}

// Timeline returns the issue's events (History) and how they were found.
//
// Cost: the per-issue index, not the streams. Every writer of this module files each
// entry it appends under its issue in the stream's index (xonce.IndexKey, a sorted set
// beside the stream, written by the same script as the entry). Round trip 1 reads, for
// each of the topology's streams, the issue's index, the stream's first id and the id
// the index began at (xonce.IndexSinceKey); round trip 2 reads the indexed entries by
// id (XRANGE id id, O(log n) each). Neither grows with the streams' length. Only the
// part of a stream older than its index (entries appended before the index began,
// before IndexTTL ago, or older than an index that holds its IndexMax newest) is
// scanned, in pages, and the report says so (Scanned); a stream whose entries are all
// indexed costs no scan.
func (in *Inspector) Timeline(ctx context.Context, issue string) (HistoryReport, error) {
	key, err := in.canonicalKey(issue)
	if err != nil {
		return HistoryReport{Issue: issue}, err
	}
	t := &timeline{in: in, key: key, rep: HistoryReport{Issue: key}, seen: map[string]bool{}}
	for _, r := range in.topo.AllInputs() {
		t.srcs = append(t.srcs, &historySource{stream: r.Stream, kind: KindInput, route: r})
	}
	t.srcs = append(t.srcs, &historySource{stream: in.topo.Results(), kind: KindResults},
		&historySource{stream: in.topo.Dead(), kind: KindDead},
		&historySource{stream: in.audit.Stream(), kind: KindAudit})

	// 1. Round trip 1: each stream's index of the issue, index start and first entry.
	pipe := in.rdb.Pipeline()
	for _, s := range t.srcs {
		s.ids = pipe.ZRange(ctx, xonce.IndexKey(s.stream, key), 0, -1)
		s.since = pipe.Get(ctx, xonce.IndexSinceKey(s.stream))
		s.first = pipe.XRangeN(ctx, s.stream, "-", "+", 1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return t.rep, fmt.Errorf("history index: %w", err)
	}
	// 2. Round trip 2: the indexed entries, and each stream's horizon.
	if err := t.readIndexed(ctx); err != nil {
		return t.rep, err
	}
	t.rep.Indexed = len(t.rep.Events)
	// 3. The fallback: each stream's part older than its index, scanned like before.
	if err := t.scanOld(ctx); err != nil {
		return t.rep, err
	}
	sort.SliceStable(t.rep.Events, func(a, b int) bool {
		if c := streamid.Compare(t.rep.Events[a].ID, t.rep.Events[b].ID); c != 0 {
			return c < 0
		}
		// Ids of different streams in one millisecond do not order them: the input
		// first (the cause), then what its runs recorded, then operators' actions, so
		// the order does not depend on the namespace's name.
		if ra, rb := kindRank(t.rep.Events[a].Kind), kindRank(t.rep.Events[b].Kind); ra != rb {
			return ra < rb
		}
		return t.rep.Events[a].Stream < t.rep.Events[b].Stream
	})
	return t.rep, nil
}

// kindRank orders the events of one millisecond across streams (Timeline).
func kindRank(kind string) int {
	switch kind {
	case KindInput:
		return 0
	case KindResults:
		return 1
	case KindDead:
		return 2
	}
	return 3
}

// historySource is one stream Timeline reads, and what it read of it.
type historySource struct {
	stream, kind string
	route        event.Route
	ids          *redis.StringSliceCmd
	since        *redis.StringCmd
	first        *redis.XMessageSliceCmd
	horizon      string // the stream's entries before it are scanned
}

// timeline is one run of Timeline: its sources, the report it fills and the entries
// already in it.
type timeline struct {
	in   *Inspector
	key  string
	srcs []*historySource
	rep  HistoryReport
	seen map[string]bool // stream + " " + id of the events in rep
}

// add files m of s in the report, once.
func (t *timeline) add(s *historySource, m redis.XMessage) {
	if t.seen[s.stream+" "+m.ID] {
		return
	}
	t.seen[s.stream+" "+m.ID] = true
	t.rep.Events = append(t.rep.Events, historyEvent(s.stream, s.kind, s.route, m, t.key))
}

// readIndexed is step 2 of Timeline: it reads the entries the indexes name (one
// pipeline) and sets each source's horizon.
func (t *timeline) readIndexed(ctx context.Context) error {
	// An index id is at least its TTL old when it may have expired with its key.
	expired := streamid.ID{MS: uint64(max(t.in.now().Add(-xonce.IndexTTL).UnixMilli(), 0))}
	pipe := t.in.rdb.Pipeline()
	type fetch struct {
		s   *historySource
		cmd *redis.XMessageSliceCmd
	}
	var fetches []fetch
	for _, s := range t.srcs {
		ids, err := s.ids.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("history index of %s: %w", s.stream, err)
		}
		for i, m := range ids {
			ids[i] = xonce.IndexID(m)
		}
		for _, id := range ids {
			fetches = append(fetches, fetch{s, pipe.XRangeN(ctx, s.stream, id, id, 1)})
		}
		if err := s.setHorizon(ids, expired); err != nil {
			return err
		}
	}
	if len(fetches) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("history: read indexed entries: %w", err)
		}
	}
	for _, f := range fetches {
		xs, err := f.cmd.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("history: read %s: %w", f.s.stream, err)
		}
		for _, m := range xs { // none when the stream trimmed it since
			t.add(f.s, m)
		}
	}
	return nil
}

// setHorizon sets the id before which s's entries may be missing from its index of
// ids (none when the stream is empty or gone; "+" when nothing was ever indexed).
func (s *historySource) setHorizon(ids []string, expired streamid.ID) error {
	first, err := s.first.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("history: first entry of %s: %w", s.stream, err)
	}
	if len(first) == 0 {
		return nil // empty or gone: nothing older than the index either
	}
	since, err := s.since.Result()
	if errors.Is(err, redis.Nil) {
		s.horizon = "+" // nothing was ever indexed here: all of it
		return nil
	}
	if err != nil {
		return fmt.Errorf("history: index start of %s: %w", s.stream, err)
	}
	h, _ := streamid.ParseFull(since)
	if expired.After(h) {
		h = expired
	}
	if len(ids) >= xonce.IndexMax {
		if o, ok := streamid.ParseFull(ids[0]); ok && o.After(h) {
			h = o
		}
	}
	if f, ok := streamid.ParseFull(first[0].ID); ok && h.After(f) {
		s.horizon = h.String()
	}
	return nil
}

// scanOld is step 3 of Timeline: it scans each stream's part older than its index, in
// pages, and says so in the report.
func (t *timeline) scanOld(ctx context.Context) error {
	var old []*historySource
	for _, s := range t.srcs {
		if s.horizon != "" {
			old = append(old, s)
		}
	}
	if len(old) == 0 {
		return nil
	}
	sc := &HistoryScan{}
	var ends []string
	for _, s := range old {
		sc.Streams = append(sc.Streams, s.stream)
		end := s.horizon
		if end != "+" {
			end = "(" + end
			if b := streamid.Time(s.horizon); sc.Before.IsZero() || b.After(sc.Before) {
				sc.Before = b
			}
		} else {
			sc.Whole = true
		}
		ends = append(ends, end)
	}
	err := t.in.scanTo(ctx, len(old), func(i int) string { return old[i].stream }, func(i int) string { return ends[i] },
		func(i int, m redis.XMessage) {
			sc.Entries++
			s := old[i]
			raw := event.EntryIssue(s.stream, m.ID, m.Values)
			if k, _ := t.in.canonical(raw); k != t.key {
				return
			}
			t.add(s, m)
		})
	if err != nil {
		return err
	}
	t.rep.Scanned = sc
	return nil
}

// HistoryScan says which part of the streams Timeline had to scan: the entries older
// than the per-issue index.
type HistoryScan struct {
	// Streams were scanned from their first entry up to Before (every one of them when
	// Whole: a stream nothing was ever indexed in).
	Streams []string `json:"streams"`
	// Before is the latest bound of the scanned ranges (zero when only Whole streams).
	Before time.Time `json:"before,omitzero"`
	Whole  bool      `json:"whole,omitempty"`
	// Entries is how many entries the scan read.
	Entries int `json:"entries"`
}

// String says it for an operator, on screen.
func (sc *HistoryScan) String() string {
	what := "entries before " + sc.Before.UTC().Format("2006-01-02 15:04:05Z") + " (older than the per-issue index)"
	if sc.Whole {
		what = "entries older than the per-issue index (some stream was never indexed)"
	}
	return fmt.Sprintf("scanned %d %s in %d stream(s): %s", sc.Entries, what, len(sc.Streams), strings.Join(sc.Streams, ", "))
}

func historyEvent(stream, kind string, route event.Route, m redis.XMessage, key string) HistoryEvent {
	v := func(k string) string { return fieldStr(m.Values[k]) }
	ev := HistoryEvent{Time: streamid.Time(m.ID), Stream: stream, ID: m.ID, Kind: kind, Issue: key}
	if kind == KindAudit {
		return auditEvent(ev, audit.FromMessage(m))
	}
	_, hasPayload := m.Values[event.FieldPayload]
	_, hasUUID := m.Values[event.FieldUUID]
	if !hasPayload && !hasUUID {
		// A results record: plain fields.
		ev.EventType, ev.Agent, ev.Fence, ev.CorrelationID = v("event_type"), v("agent"), v("fence"), v("correlation_id")
		ev.TraceID = v("trace_id")
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
	if sc, ok := event.ParseTraceParent(md(event.MetaTraceParent)); ok {
		ev.TraceID = sc.TraceID().String()
	}
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

// EventOperatorPrefix starts the event type of an operator's write in a history
// ("operator.release"); its outcome, who, from where and why are its Detail.
const EventOperatorPrefix = "operator."

func auditEvent(ev HistoryEvent, r audit.Record) HistoryEvent {
	ev.EventType = EventOperatorPrefix + r.Action
	ev.Reason = r.Outcome
	if r.Ref != "" {
		ev.About = "audit " + r.Ref
	}
	d := fmt.Sprintf("%s by %s from %s: %s; why: %s", r.Outcome, r.Who, r.From, r.Scope, r.Reason)
	if r.Detail != "" {
		d += "; " + r.Detail
	}
	ev.Detail = d
	for _, f := range strings.Fields(r.Scope) {
		if a, ok := strings.CutPrefix(f, "agent="); ok {
			ev.Agent = a
		}
	}
	return ev
}

// conflictDetail says why a lock.dropped, lock.coalesced, lock.delivered or
// lock.superseded record's entry did not run (or was stopped),
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
	case v("event_type") == event.LockSuperseded && v("cancelled") == "true" && v("ran") == "true":
		d = fmt.Sprintf("cancelled: the newer entry %s took the issue over (fence %s); this run was stopped and its later writes refused", entry, fence)
	case v("event_type") == event.LockSuperseded && v("cancelled") == "true":
		d = fmt.Sprintf("superseded before it ran: the newer entry %s took the issue over (fence %s) while this one waited for an older run to stop", entry, fence)
	case v("event_type") == event.LockSuperseded:
		d = "superseded by the newer entry " + entry + "; not run"
	case v("reason") == "superseded":
		d = "superseded by entry " + entry + ", whose run of the issue ended after this one was queued"
	case v("event_type") == event.LockDelivered:
		d = fmt.Sprintf("delivered as follow-up %s to the run of entry %s, held by %s (fence %s)", v("mailbox_id"), entry, holder, fence)
	case v("event_type") == event.LockWaited:
		d = fmt.Sprintf("waits in the key's line (place %s) behind entry %s, held by %s (fence %s); runs as a copy naming it (waited_from) when its turn comes",
			v("position"), entry, holder, fence)
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
	return in.scanRange(ctx, n, stream, start, func(int) string { return end }, fn)
}

// scanTo is scan from each stream's first entry up to end(i).
func (in *Inspector) scanTo(ctx context.Context, n int, stream, end func(int) string, fn func(int, redis.XMessage)) error {
	return in.scanRange(ctx, n, stream, "-", end, fn)
}

func (in *Inspector) scanRange(ctx context.Context, n int, stream func(int) string, start string, end func(int) string, fn func(int, redis.XMessage)) error {
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
			cmds[i] = pipe.XRangeN(ctx, stream(i), next[i], end(i), in.page)
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

// ShortDetail is a timeline entry's Detail for a table: each JSON object in it (a
// record's detail, as a handler writes it) becomes key=value pairs in key order, a
// string quoted only when it has spaces or quotes, a null left out, anything nested
// kept as compact JSON. The rest of the text is kept as it is.
func ShortDetail(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		dec := json.NewDecoder(strings.NewReader(s[i:]))
		var obj map[string]json.RawMessage
		if err := dec.Decode(&obj); err != nil {
			b.WriteString(s[i:])
			return b.String()
		}
		b.WriteString(keyValues(obj))
		s = s[i+int(dec.InputOffset()):]
	}
}

func keyValues(obj map[string]json.RawMessage) string {
	parts := make([]string, 0, len(obj))
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		raw := obj[k]
		var str string
		switch {
		case string(raw) == "null":
			continue
		case json.Unmarshal(raw, &str) == nil:
			if str == "" || strings.ContainsAny(str, " \t\n\"=") {
				str = strconv.Quote(str)
			}
			parts = append(parts, k+"="+str)
		default:
			var compact bytes.Buffer
			if json.Compact(&compact, raw) != nil {
				compact.Reset()
				compact.Write(raw)
			}
			parts = append(parts, k+"="+compact.String())
		}
	}
	return strings.Join(parts, " ")
}
