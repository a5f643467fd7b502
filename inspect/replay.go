package inspect

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/streamid"
)

// ReplayOptions select the events Replay re-publishes.
type ReplayOptions struct {
	// Stream is an input stream, in full ("ymir:triage") or relative to the namespace
	// ("triage", "rebase:c9s:todo").
	Stream string
	// From and To bound the range of stream ids, inclusive ("-" and "+" by default;
	// "(" before an id makes a bound exclusive). To is capped at the stream's last
	// entry when the replay starts, so the replayed events are never replayed again.
	From, To string
	// Issue keeps only that issue's events ("" for all).
	Issue string
	// DryRun lists what would be replayed without publishing.
	DryRun bool
	// TracerProvider traces each replayed publish: a new trace, linked to the one the
	// original event ran in (docs/architecture.md, "Tracing"). Nil: no spans; the
	// replayed event still carries the link (metadata trace_link), for the worker's span.
	TracerProvider trace.TracerProvider
}

// ReplayReport is what Replay did (or would do).
type ReplayReport struct {
	Stream  string          `json:"stream"`
	DryRun  bool            `json:"dry_run"`
	Events  []ReplayedEvent `json:"events"`
	Skipped []SkippedEntry  `json:"skipped"`
}

// ReplayedEvent is one re-published event.
type ReplayedEvent struct {
	// ReplayOf is the original entry's id, also written as the new event's replay_of.
	ReplayOf  string `json:"replay_of"`
	ID        string `json:"id,omitempty"` // the new entry's id; "" in a dry run
	Issue     string `json:"issue"`
	EventType string `json:"event_type"`
	// CorrelationID is the new event's (a fresh one); Original its predecessor's.
	CorrelationID         string `json:"correlation_id,omitempty"`
	OriginalCorrelationID string `json:"original_correlation_id,omitempty"`
}

// SkippedEntry is an entry Replay left alone, and why.
type SkippedEntry struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// Replay re-publishes past events of one input stream as new entries at its end, so
// they take the normal path: the lock middleware drops or coalesces an event whose
// issue is locked, like any other. Each new event gets a new UUID, a new correlation
// id, replay_of set to the original stream id, causation_id set to the original UUID,
// attempt 0 and no fence; payload and other metadata are kept. Undecodable entries
// are skipped, not replayed.
//
// Events are published one by one through Publisher, the pipeline's normal publish
// path. Cost: one round trip for the stream's last id, one per page of PageSize
// entries read, and one per event replayed.
//
// A replay that publishes (not DryRun) is an operator's write: it runs once the audit
// trail has recorded it (Config.Audit).
func (in *Inspector) Replay(ctx context.Context, o ReplayOptions) (rep ReplayReport, err error) {
	if o.DryRun {
		return in.replay(ctx, o)
	}
	route, err := ResolveStream(in.topo, o.Stream)
	if err != nil {
		return ReplayReport{}, err
	}
	scope := fmt.Sprintf("stream=%s from=%s to=%s", route.Stream, or(o.From, "-"), or(o.To, "+"))
	var issues []string
	if o.Issue != "" {
		key, err := in.canonicalKey(o.Issue)
		if err != nil {
			return ReplayReport{}, err
		}
		scope, issues = scope+" issue="+key, []string{key}
	}
	err = in.write(ctx, ActionReplay, scope, issues, func(ctx context.Context) error {
		rep, err = in.replay(ctx, o)
		return err
	})
	return rep, err
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func (in *Inspector) replay(ctx context.Context, o ReplayOptions) (ReplayReport, error) {
	route, err := ResolveStream(in.topo, o.Stream)
	if err != nil {
		return ReplayReport{}, err
	}
	// 1. The range and the issue filter, checked.
	from, to, issue, err := in.replayRange(o)
	if err != nil {
		return ReplayReport{}, err
	}
	rep := ReplayReport{Stream: route.Stream, DryRun: o.DryRun, Events: []ReplayedEvent{}, Skipped: []SkippedEntry{}}

	// 2. Cap the range at today's last entry: the events appended below lie beyond it.
	last, err := in.rdb.XRevRangeN(ctx, route.Stream, "+", "-", 1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return rep, fmt.Errorf("xrevrange %s: %w", route.Stream, err)
	}
	if len(last) == 0 {
		return rep, nil
	}
	lastID := last[0].ID
	if to == "+" || beyond(to, lastID) {
		to = lastID
	}

	// 3. Page by page: the entries to replay, then their replays appended (but in a dry run).
	pub := event.NewPublisher(in.rdb, in.maxLen).WithMaxEventBytes(in.maxBytes).WithTracerProvider(o.TracerProvider)
	next := from
	for {
		page, err := in.rdb.XRangeN(ctx, route.Stream, next, to, in.page).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return rep, fmt.Errorf("xrange %s: %w", route.Stream, err)
		}
		msgs, evs := in.replayPage(route, page, issue, &rep)
		if err := replayPublish(ctx, pub, route.Stream, msgs, evs, o.DryRun, &rep); err != nil {
			return rep, err
		}
		if int64(len(page)) < in.page {
			return rep, nil
		}
		next = "(" + page[len(page)-1].ID
	}
}

// replayRange returns o's range ("-" and "+" when open) and its issue's canonical key
// ("" for every issue), each checked.
func (in *Inspector) replayRange(o ReplayOptions) (from, to, issue string, err error) {
	from, to = or(o.From, "-"), or(o.To, "+")
	for _, b := range []string{from, to} {
		if err := CheckRangeID(b); err != nil {
			return "", "", "", err
		}
	}
	if o.Issue != "" {
		if issue, err = in.canonicalKey(o.Issue); err != nil {
			return "", "", "", err
		}
	}
	return from, to, issue, nil
}

// replayPage picks the entries of page to replay (of issue, if not ""), noting in rep
// those it skips, and returns their replays.
func (in *Inspector) replayPage(route event.Route, page []redis.XMessage, issue string, rep *ReplayReport) ([]*message.Message, []ReplayedEvent) {
	var msgs []*message.Message
	var evs []ReplayedEvent
	for _, m := range page {
		orig := event.DecodeEntry(route.Stream, m.ID, m.Values)
		key, valid := in.canonical(event.EntryIssue(route.Stream, m.ID, m.Values))
		if issue != "" && key != issue {
			continue
		}
		if bad := event.BadReason(orig); bad != "" {
			rep.Skipped = append(rep.Skipped, SkippedEntry{ID: m.ID, Reason: bad})
			continue
		}
		if !valid {
			rep.Skipped = append(rep.Skipped, SkippedEntry{ID: m.ID, Reason: fmt.Sprintf("no valid issue key (%q)", key)})
			continue
		}
		msg := replayOf(orig, m.ID, route)
		msgs = append(msgs, msg)
		evs = append(evs, ReplayedEvent{ReplayOf: m.ID, Issue: key, EventType: msg.Metadata.Get(event.MetaEventType),
			CorrelationID: msg.Metadata.Get(event.MetaCorrelationID), OriginalCorrelationID: orig.Metadata.Get(event.MetaCorrelationID)})
	}
	return msgs, evs
}

// replayPublish appends msgs to stream and adds each to rep as it is appended; a dry
// run appends nothing and adds evs without their new correlation ids.
func replayPublish(ctx context.Context, pub *event.Publisher, stream string, msgs []*message.Message, evs []ReplayedEvent, dryRun bool, rep *ReplayReport) error {
	if dryRun {
		for i := range evs {
			evs[i].CorrelationID = ""
		}
		rep.Events = append(rep.Events, evs...)
		return nil
	}
	for i, msg := range msgs {
		id, err := pub.PublishID(ctx, stream, msg)
		if err != nil {
			return fmt.Errorf("replay of %s: %w", evs[i].ReplayOf, err)
		}
		evs[i].ID = id
		rep.Events = append(rep.Events, evs[i])
	}
	return nil
}

// beyond reports whether the range end bound lies after the full id last.
func beyond(bound, last string) bool {
	b := strings.TrimPrefix(bound, "(")
	if !strings.Contains(b, "-") {
		// "ms" as an end bound means ms-<max seq>.
		bid, _ := streamid.Parse(b)
		lid, _ := streamid.Parse(last)
		return bid.MS >= lid.MS
	}
	return streamid.Compare(b, last) > 0
}

// replayOf builds the replay of orig (read from route's stream at id).
func replayOf(orig *message.Message, id string, route event.Route) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), orig.Payload)
	for k, v := range orig.Metadata {
		if strings.HasPrefix(k, "_ymir_") || k == event.MetaFence {
			continue
		}
		msg.Metadata.Set(k, v)
	}
	if msg.Metadata.Get(event.MetaEventType) == "" {
		msg.Metadata.Set(event.MetaEventType, event.RequestedEvent(route.Agent))
	}
	if msg.Metadata.Get(event.MetaSchemaVersion) == "" {
		msg.Metadata.Set(event.MetaSchemaVersion, event.SchemaVersion)
	}
	msg.Metadata.Set(event.MetaReplayOf, id)
	msg.Metadata.Set(event.MetaCorrelationID, watermill.NewUUID())
	msg.Metadata.Set(event.MetaCausationID, orig.UUID)
	msg.Metadata.Set(event.MetaAttempt, "0")
	event.MarkReplay(msg)
	return msg
}
