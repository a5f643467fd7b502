package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/pipeline/event"
)

// StageStats is what happened at one stage (a consumer group: triage, rebase-c9s, ...).
// Published, Dropped, Succeeded, Failed, Dead and Pending are read from the streams;
// Run, Retried and Running are the handlers' own counts.
type StageStats struct {
	Stage string `json:"stage"`
	// Published is the number of entries appended to the stage's input streams (the
	// :todo twin included), duplicates included.
	Published int `json:"published"`
	// Run is the number of events that got the lease and reached the handler.
	Run int `json:"run"`
	// Dropped is the number of lock.dropped records: events acked without running
	// because another holder had (or had just had) the issue.
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

func (s *StageStats) add(o StageStats) {
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

// stage is one consumer group of the topology.
type stage struct {
	agent, branch, name string
	routes              []event.Route
}

func stagesOf(topo event.Topology) []stage {
	var out []stage
	add := func(agent, branch string) {
		out = append(out, stage{agent: agent, branch: branch, name: topo.Group(agent, branch), routes: topo.Inputs(agent, branch)})
	}
	add("triage", "")
	for _, a := range event.Agents[1:] {
		for _, b := range event.Branches {
			add(a, b)
		}
	}
	return out
}

// handlerCounts counts, per stage, the events that reached the handler, their attempts
// and the handlers at work. It wraps each worker's handler (inside the lock and the
// retries, so an attempt is one call).
type handlerCounts struct {
	mu      sync.Mutex
	seen    map[string]bool // stream|id of events that reached a handler
	run     map[string]int
	retried map[string]int
	running map[string]int
}

func newHandlerCounts() *handlerCounts {
	return &handlerCounts{seen: map[string]bool{}, run: map[string]int{}, retried: map[string]int{}, running: map[string]int{}}
}

func (c *handlerCounts) wrap(stageName string, h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		id := event.EntryStream(msg) + "|" + event.EntryID(msg) + "|" + msg.UUID
		c.mu.Lock()
		if c.seen[id] {
			c.retried[stageName]++
		} else {
			c.seen[id] = true
			c.run[stageName]++
		}
		c.running[stageName]++
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.running[stageName]--
			c.mu.Unlock()
		}()
		return h(msg)
	}
}

func (c *handlerCounts) fill(st *StageStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.Run, st.Retried, st.Running = c.run[st.Stage], c.retried[st.Stage], c.running[st.Stage]
}

// Terminal record types of the results stream.
const (
	evDone      = event.StageDone
	evFailed    = event.StageFailed
	evDropped   = event.LockDropped
	evCoalesced = event.LockCoalesced
)

// tally reads the results and dead-letter streams incrementally and keeps, per stage,
// the count of each kind of record, and per input entry whether it has a terminal one.
type tally struct {
	rdb    redis.UniversalClient
	topo   event.Topology
	stages []stage
	byStr  map[string]string // input stream -> stage name

	lastResult, lastDead string
	counts               map[string]*StageStats
	outcome              map[string]string // stream|id -> first terminal record type
	repeats              []string          // entries with more than one terminal record
	dropReasons          map[string]int    // lock.dropped reason -> count
	followups            []FollowupResult  // followup.delivered and followup.rolled records
	unknown              int               // records about streams outside the topology
}

func newTally(rdb redis.UniversalClient, topo event.Topology) *tally {
	t := &tally{rdb: rdb, topo: topo, stages: stagesOf(topo), byStr: map[string]string{},
		lastResult: "-", lastDead: "-", counts: map[string]*StageStats{}, outcome: map[string]string{},
		dropReasons: map[string]int{}}
	for _, s := range t.stages {
		t.counts[s.name] = &StageStats{Stage: s.name}
		for _, r := range s.routes {
			t.byStr[r.Stream] = s.name
		}
	}
	return t
}

// poll reads the records appended since the last poll.
func (t *tally) poll(ctx context.Context) error {
	if err := t.readSince(ctx, t.topo.Results(), &t.lastResult, t.result); err != nil {
		return err
	}
	return t.readSince(ctx, t.topo.Dead(), &t.lastDead, t.dead)
}

// readSince hands each entry of stream after *last to fn, and moves *last on.
func (t *tally) readSince(ctx context.Context, stream string, last *string, fn func(map[string]any)) error {
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
			fn(m.Values)
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

func (t *tally) result(v map[string]any) {
	stream, id, et := str(v["stream"]), str(v["message_id"]), str(v["event_type"])
	name, ok := t.byStr[stream]
	if !ok {
		t.unknown++
		return
	}
	c := t.counts[name]
	switch et {
	case event.FollowupDelivered, event.FollowupRolled:
		// About a follow-up, not about the entry it names (the run's): not terminal.
		var d map[string]string
		_ = json.Unmarshal([]byte(str(v["detail"])), &d)
		t.followups = append(t.followups, FollowupResult{Key: str(v["issue_key"]), Stage: name, Fate: et,
			CommentID: d["followup_comment_id"], Author: d["followup_author"]})
		return
	case event.LockDelivered:
		c.Delivered++
	case evDone:
		c.Succeeded++
	case evFailed:
		c.Failed++
	case evDropped, evCoalesced:
		c.Dropped++
		t.dropReasons[str(v["reason"])]++
	default:
		return
	}
	t.terminal(stream, id, et)
}

func (t *tally) dead(v map[string]any) {
	stream, id := str(v[event.DeadFieldStream]), str(v[event.DeadFieldID])
	name, ok := t.byStr[stream]
	if !ok {
		t.unknown++
		return
	}
	t.counts[name].Dead++
	key := stream + "|" + id
	switch t.outcome[key] {
	case "":
		// A bad event is dead-lettered without a record: the dead letter is its outcome.
		t.terminal(stream, id, event.Dead)
	case evFailed:
		// The stage.failed record of the last attempt, then its dead letter: one outcome.
	default:
		t.repeats = append(t.repeats, key+" (dead after "+t.outcome[key]+")")
	}
}

func (t *tally) terminal(stream, id, et string) {
	key := stream + "|" + id
	if prev, ok := t.outcome[key]; ok {
		if prev == event.Dead && et == evFailed {
			t.outcome[key] = et // the dead letter was read first; same outcome
			return
		}
		t.repeats = append(t.repeats, key+" ("+prev+", then "+et+")")
		return
	}
	t.outcome[key] = et
	t.counts[t.byStr[stream]].Outcomes++
}

// streamState reads, in one round trip, every input stream's length and pending count.
func (t *tally) streamState(ctx context.Context) (published, pending map[string]int, err error) {
	type q struct {
		stage string
		xlen  *redis.IntCmd
		pend  *redis.XPendingCmd
	}
	var qs []q
	_, _ = t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, s := range t.stages {
			for _, r := range s.routes {
				qs = append(qs, q{stage: s.name, xlen: p.XLen(ctx, r.Stream), pend: p.XPending(ctx, r.Stream, r.Group)})
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

// snapshot is every stage's numbers at one moment.
type snapshot struct {
	stages []StageStats
	total  StageStats
}

// take polls the streams and merges the handlers' counts. The results are read before
// the stream lengths: a triage record is written after its downstream publish, so a
// stage that looks complete here really is.
func (t *tally) take(ctx context.Context, hc *handlerCounts) (snapshot, error) {
	if err := t.poll(ctx); err != nil {
		return snapshot{}, err
	}
	published, pending, err := t.streamState(ctx)
	if err != nil {
		return snapshot{}, err
	}
	var snap snapshot
	snap.total.Stage = "total"
	for _, s := range t.stages {
		st := *t.counts[s.name]
		st.Published, st.Pending = published[s.name], pending[s.name]
		hc.fill(&st)
		snap.stages = append(snap.stages, st)
		snap.total.add(st)
	}
	return snap, nil
}

// drained reports whether every published entry has its outcome and nothing is pending
// or running.
func (s snapshot) drained() bool {
	for _, st := range s.stages {
		if st.Outcomes < st.Published || st.Pending > 0 || st.Running > 0 {
			return false
		}
	}
	return true
}
