package progress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
)

// StageStats is what happened at one stage (a consumer group: triage, rebase-c9s, ...).
// Published, Dropped, Succeeded, Failed, Dead and Pending are read from the streams;
// Run, Retried and Running are counted by whoever runs the handlers (the demo).
type StageStats struct {
	Stage string `json:"stage"`
	// Published is the number of entries appended to the stage's input streams (the
	// :todo twin included), duplicates included.
	Published int `json:"published"`
	// Run is the number of events that got the lease and reached the handler.
	Run int `json:"run"`
	// Dropped is the number of lock.dropped and lock.coalesced records: events acked
	// without running because another holder had (or had just had) the issue.
	Dropped int `json:"dropped"`
	// Delivered is the number of lock.delivered records: events (a maintainer's
	// comment) handed to the running holder's mailbox as follow-ups instead of running.
	Delivered int `json:"delivered"`
	// Retried is the number of handler attempts after an event's first.
	Retried int `json:"retried"`
	// Succeeded and Failed count the stage.done and stage.failed records (failed: every
	// attempt failed; the event then went to the dead-letter stream).
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	// Dead is the number of the stage's entries in the dead-letter stream.
	Dead int `json:"dead"`
	// Running is the number of handlers at work now (live view only).
	Running int `json:"running,omitempty"`
	// Pending is the number of entries delivered and not acked.
	Pending int `json:"pending"`
	// Outcomes is the number of the stage's entries that have a terminal record
	// (stage.done, stage.failed, lock.dropped, lock.delivered, or a dead letter).
	Outcomes int `json:"outcomes"`
}

// Add adds o's counts to s.
func (s *StageStats) Add(o StageStats) {
	s.Published += o.Published
	s.Run += o.Run
	s.Dropped += o.Dropped
	s.Delivered += o.Delivered
	s.Retried += o.Retried
	s.Succeeded += o.Succeeded
	s.Failed += o.Failed
	s.Dead += o.Dead
	s.Running += o.Running
	s.Pending += o.Pending
	s.Outcomes += o.Outcomes
}

// Stage is one consumer group of the topology.
type Stage struct {
	Agent, Branch, Name string
	Routes              []event.Route
}

// Stages returns the stages of topo: triage, then every downstream agent on every
// branch.
func Stages(topo event.Topology) []Stage {
	var out []Stage
	add := func(agent, branch string) {
		out = append(out, Stage{Agent: agent, Branch: branch, Name: topo.Group(agent, branch), Routes: topo.Inputs(agent, branch)})
	}
	add("triage", "")
	for _, a := range event.Agents[1:] {
		for _, b := range event.Branches {
			add(a, b)
		}
	}
	return out
}

// Followup is a followup.delivered or followup.rolled record: a maintainer's comment
// acknowledged by its live run, or rolled into a run's Task JSON.
type Followup struct {
	Key, Stage, Fate, CommentID, Author string
}

// Tally reads the results and dead-letter streams incrementally and keeps, per stage,
// the count of each kind of record, and per input entry whether it has a terminal one.
type Tally struct {
	rdb    redis.UniversalClient
	topo   event.Topology
	stages []Stage
	byStr  map[string]string // input stream -> stage name

	// OnResult, when set, is called with each results record read (stage: its stage's
	// name; field: any of the entry's fields, e.g. a lock record's holder_fence), and
	// OnDead with each dead letter's stage, issue and error.
	OnResult func(stage string, rec event.Record, field func(string) string)
	OnDead   func(stage, issue, reason string)

	lastResult, lastDead string
	counts               map[string]*StageStats
	outcome              map[string]string         // stream|id -> first terminal record type
	kinds                map[string]map[string]int // stage -> outcome (OutcomeOf) -> count
	// Repeats lists entries with more than one terminal record.
	Repeats []string
	// DropReasons counts lock.dropped and lock.coalesced records by reason.
	DropReasons map[string]int
	// Followups are the followup.delivered and followup.rolled records read.
	Followups []Followup
	// Unknown counts records about streams outside the topology.
	Unknown int
}

// NewTally returns a tally of topo's streams on rdb, from their beginning.
func NewTally(rdb redis.UniversalClient, topo event.Topology) *Tally {
	t := &Tally{rdb: rdb, topo: topo, stages: Stages(topo), byStr: map[string]string{},
		lastResult: "-", lastDead: "-", counts: map[string]*StageStats{}, outcome: map[string]string{},
		kinds: map[string]map[string]int{}, DropReasons: map[string]int{}}
	for _, s := range t.stages {
		t.counts[s.Name] = &StageStats{Stage: s.Name}
		t.kinds[s.Name] = map[string]int{}
		for _, r := range s.Routes {
			t.byStr[r.Stream] = s.Name
		}
	}
	return t
}

// StageOf returns the stage that reads stream ("" for none).
func (t *Tally) StageOf(stream string) string { return t.byStr[stream] }

// Kinds returns how many records of stage ended each way (OutcomeOf), dead letters
// included ("dead-lettered").
func (t *Tally) Kinds(stage string) map[string]int { return t.kinds[stage] }

// OutcomeOf names how a record ended its entry, for counting: a stage.done's outcome
// (a resolution, a label, skipped), failed, or the lock's or follow-up's verdict; ""
// for records that say nothing about an entry's end.
func OutcomeOf(rec event.Record) string {
	switch rec.EventType {
	case event.StageDone:
		if rec.Outcome == "" {
			return "done"
		}
		return rec.Outcome
	case event.StageFailed:
		return "failed"
	case event.FollowupDelivered:
		return "comment acknowledged"
	case event.FollowupRolled:
		return "comment rolled into a run"
	}
	if v, ok := strings.CutPrefix(rec.EventType, "lock."); ok {
		return v
	}
	return ""
}

// SkipExisting makes the tally start after the records the streams hold now: a dev
// restarted on a real Redis counts its own run, not the namespace's past.
func (t *Tally) SkipExisting(ctx context.Context) error {
	for _, s := range []struct {
		stream string
		last   *string
	}{{t.topo.Results(), &t.lastResult}, {t.topo.Dead(), &t.lastDead}} {
		msgs, err := t.rdb.XRevRangeN(ctx, s.stream, "+", "-", 1).Result()
		if err != nil {
			return fmt.Errorf("read %s: %w", s.stream, err)
		}
		if len(msgs) > 0 {
			*s.last = msgs[0].ID
		}
	}
	return nil
}

// Poll reads the records appended since the last poll.
func (t *Tally) Poll(ctx context.Context) error {
	if err := t.readSince(ctx, t.topo.Results(), &t.lastResult, t.result); err != nil {
		return err
	}
	return t.readSince(ctx, t.topo.Dead(), &t.lastDead, t.dead)
}

// readSince hands each entry of stream after *last to fn, and moves *last on.
func (t *Tally) readSince(ctx context.Context, stream string, last *string, fn func(redis.XMessage)) error {
	for {
		msgs, err := t.rdb.XRangeN(ctx, stream, *last, "+", 500).Result()
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		for _, m := range msgs {
			if m.ID == *last {
				continue
			}
			*last = m.ID
			fn(m)
		}
		if len(msgs) < 500 {
			return nil
		}
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func recordOf(m redis.XMessage) event.Record {
	v := func(k string) string { return str(m.Values[k]) }
	return event.Record{ID: m.ID, EventType: v("event_type"), Agent: v("agent"), IssueKey: v("issue_key"), MessageID: v("message_id"),
		Stream: v("stream"), CorrelationID: v("correlation_id"), Fence: v("fence"), Outcome: v("outcome"), Detail: v("detail"),
		TraceID: v("trace_id")}
}

func (t *Tally) result(m redis.XMessage) {
	rec := recordOf(m)
	name, ok := t.byStr[rec.Stream]
	if !ok {
		t.Unknown++
		return
	}
	if k := OutcomeOf(rec); k != "" {
		t.kinds[name][k]++
	}
	if t.OnResult != nil {
		t.OnResult(name, rec, func(k string) string { return str(m.Values[k]) })
	}
	c := t.counts[name]
	switch rec.EventType {
	case event.FollowupDelivered, event.FollowupRolled:
		// About a follow-up, not about the entry it names (the run's): not terminal.
		var d map[string]string
		_ = json.Unmarshal([]byte(rec.Detail), &d)
		t.Followups = append(t.Followups, Followup{Key: rec.IssueKey, Stage: name, Fate: rec.EventType,
			CommentID: d["followup_comment_id"], Author: d["followup_author"]})
		return
	case event.LockDelivered:
		c.Delivered++
	case event.StageDone:
		c.Succeeded++
	case event.StageFailed:
		c.Failed++
	case event.LockDropped, event.LockCoalesced:
		c.Dropped++
		t.DropReasons[str(m.Values["reason"])]++
	default:
		return
	}
	t.terminal(rec.Stream, rec.MessageID, rec.EventType)
}

func (t *Tally) dead(m redis.XMessage) {
	stream, id := str(m.Values[event.DeadFieldStream]), str(m.Values[event.DeadFieldID])
	name, ok := t.byStr[stream]
	if !ok {
		t.Unknown++
		return
	}
	t.counts[name].Dead++
	t.kinds[name]["dead-lettered"]++
	if t.OnDead != nil {
		t.OnDead(name, event.EntryIssue(stream, m.ID, m.Values), str(m.Values[event.DeadFieldError]))
	}
	key := stream + "|" + id
	switch t.outcome[key] {
	case "":
		// A bad event is dead-lettered without a record: the dead letter is its outcome.
		t.terminal(stream, id, event.Dead)
	case event.StageFailed:
		// The stage.failed record of the last attempt, then its dead letter: one outcome.
	default:
		t.Repeats = append(t.Repeats, key+" (dead after "+t.outcome[key]+")")
	}
}

func (t *Tally) terminal(stream, id, et string) {
	key := stream + "|" + id
	if prev, ok := t.outcome[key]; ok {
		if prev == event.Dead && et == event.StageFailed {
			t.outcome[key] = et // the dead letter was read first; same outcome
			return
		}
		t.Repeats = append(t.Repeats, key+" ("+prev+", then "+et+")")
		return
	}
	t.outcome[key] = et
	t.counts[t.byStr[stream]].Outcomes++
}

// streamState reads, in one round trip, every input stream's length and pending count.
func (t *Tally) streamState(ctx context.Context) (published, pending map[string]int, err error) {
	type q struct {
		stage string
		xlen  *redis.IntCmd
		pend  *redis.XPendingCmd
	}
	var qs []q
	_, _ = t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, s := range t.stages {
			for _, r := range s.Routes {
				qs = append(qs, q{stage: s.Name, xlen: p.XLen(ctx, r.Stream), pend: p.XPending(ctx, r.Stream, r.Group)})
			}
		}
		return nil
	})
	published, pending = map[string]int{}, map[string]int{}
	for _, x := range qs {
		n, err := x.xlen.Result()
		if err != nil {
			return nil, nil, fmt.Errorf("XLEN: %w", err)
		}
		published[x.stage] += int(n)
		p, err := x.pend.Result()
		switch {
		case err == nil:
			pending[x.stage] += int(p.Count)
		case isNoGroup(err):
		default:
			return nil, nil, fmt.Errorf("XPENDING: %w", err)
		}
	}
	return published, pending, nil
}

func isNoGroup(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOGROUP") || errors.Is(err, redis.Nil))
}

// Snapshot is every stage's numbers at one moment.
type Snapshot struct {
	Stages []StageStats
	Total  StageStats
}

// Take polls the streams and returns every stage's numbers; fill, when not nil, adds
// what only the caller knows (the demo's handler counts) to each stage before the
// total is made. The results are read before the stream lengths: a triage record is
// written after its downstream publish, so a stage that looks complete here really is.
func (t *Tally) Take(ctx context.Context, fill func(*StageStats)) (Snapshot, error) {
	// The streams' state first, the records after: an entry no longer pending was acked
	// after its records (stage.failed, then its dead letter) were written, so they are
	// all read here. The other order could see the ack but not the dead letter before
	// it, and call a snapshot drained that the summary then disagrees with.
	published, pending, err := t.streamState(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	if err := t.Poll(ctx); err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	snap.Total.Stage = "total"
	for _, s := range t.stages {
		st := *t.counts[s.Name]
		st.Published, st.Pending = published[s.Name], pending[s.Name]
		if fill != nil {
			fill(&st)
		}
		snap.Stages = append(snap.Stages, st)
		snap.Total.Add(st)
	}
	return snap, nil
}

// Drained reports whether every published entry has its outcome and nothing is pending
// or running.
func (s Snapshot) Drained() bool {
	for _, st := range s.Stages {
		if st.Outcomes < st.Published || st.Pending > 0 || st.Running > 0 {
			return false
		}
	}
	return true
}
