package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// maxDelayedShown bounds the delayed events Pending reads per stream.
const maxDelayedShown = 100

// PendingFilter selects the groups and entries Pending reports.
type PendingFilter struct {
	Agent  string // "" for every agent
	Branch string // "" for every branch
	Issue  string // "" for every issue; else only that issue's entries are listed
}

// Entry states.
const (
	// StateGuarded: a live lease of the entry's issue names this entry: its holder is
	// working on it and the claim veto keeps other consumers off it.
	StateGuarded = "guarded"
	// StateOrphaned: no live lease guards the entry and its consumer is not alive (it
	// died, or does not report its presence): it is claimed once it has been idle for
	// MAX_IDLE_TIME.
	StateOrphaned = "orphaned"
	// StateQueued: no lease guards the entry yet, but its consumer is alive: the worker
	// read it ahead and runs it after the entry it is working on (Note names it).
	StateQueued = "queued"
)

// GroupPending is one consumer group's pending entries list.
type GroupPending struct {
	Stream string `json:"stream"`
	Group  string `json:"group"`
	Agent  string `json:"agent"`
	Branch string `json:"branch,omitempty"`
	Todo   bool   `json:"todo"`
	// Count, Lowest, Highest and Consumers are the XPENDING summary of the whole
	// group, whatever the issue filter.
	Count     int64             `json:"count"`
	Lowest    string            `json:"lowest,omitempty"`
	Highest   string            `json:"highest,omitempty"`
	Consumers []ConsumerPending `json:"consumers"`
	// Entries are the pending entries (of the filtered issue), oldest id first.
	Entries []PendingEntry `json:"entries"`
	// Delayed are the events of the stream re-queued by the busy policy delay, soonest
	// first (at most maxDelayedShown): acked, not pending, appended again when due.
	Delayed []DelayedEvent `json:"delayed"`
	// NoGroup: the stream has entries and no consumer group, so no worker of the
	// agent has ever read it; Waiting is its length (NoWorker says it).
	NoGroup bool  `json:"no_group,omitempty"`
	Waiting int64 `json:"waiting,omitempty"`
}

// NoWorker says that n events of a stream with no consumer group wait for a worker:
// the same words in pending, streams and the console.
func NoWorker(n int64) string {
	if n == 1 {
		return "1 event waits for a worker that does not exist"
	}
	return fmt.Sprintf("%d events wait for a worker that does not exist", n)
}

// DelayedEvent is one event waiting in a stream's delayed set (the busy policy
// delay), as GroupPending lists it.
type DelayedEvent = delayq.Event

// ConsumerPending is one consumer's share of a group's pending entries.
type ConsumerPending struct {
	Name    string `json:"name"`
	Pending int64  `json:"pending"`
}

// PendingEntry is one pending entry and the lease guarding it.
type PendingEntry struct {
	ID         string        `json:"id"`
	Consumer   string        `json:"consumer"`
	Idle       time.Duration `json:"-"`
	Deliveries int64         `json:"deliveries"`
	// Issue is the entry's issue key, canonical when it is valid; "" when the entry
	// names none or is no longer in the stream.
	Issue string `json:"issue"`
	// State is StateGuarded, StateQueued or StateOrphaned.
	State string `json:"state"`
	// Lease is the live lease of the issue for this agent, when there is one; it
	// guards this entry only when State is StateGuarded (else it guards another entry
	// of the issue, and this one will be dropped as locked when redelivered).
	Lease *LeaseInfo `json:"lease,omitempty"`
	// Note explains a queued entry (which entry it waits behind, on which worker) or
	// an orphan: the entry was trimmed or deleted, names no issue, or its issue is
	// held for another entry.
	Note string `json:"note,omitempty"`
}

// MarshalJSON adds idle_ms.
func (e PendingEntry) MarshalJSON() ([]byte, error) {
	type plain PendingEntry
	return json.Marshal(struct {
		plain
		IdleMS int64 `json:"idle_ms"`
	}{plain(e), e.Idle.Milliseconds()})
}

// Pending returns, for each existing consumer group matching f, the XPENDING summary
// and every pending entry with its issue key and the lease guarding it.
//
// An entry no lease guards is StateQueued when its consumer's worker is alive (its
// presence beat, WorkerBeat): it was read ahead and waits behind the entry the
// worker runs; else StateOrphaned.
//
// Cost: one round trip for the summaries of all groups and the workers' presence; one per page of PageSize
// entries (the pages of all groups pipelined together, so the longest list counts);
// one per 1000 entries for their issue keys (XRANGE id id, pipelined); one per 500
// distinct issues for the leases (PTTL + HGETALL, pipelined). Never one round trip
// per entry, and no SCAN.
func (in *Inspector) Pending(ctx context.Context, f PendingFilter) ([]GroupPending, error) {
	issue, err := in.issueFilter(f.Issue)
	if err != nil {
		return nil, err
	}
	var routes []event.Route
	for _, r := range in.topo.AllInputs() {
		if (f.Agent == "" || r.Agent == f.Agent) && (f.Branch == "" || r.Branch == f.Branch) {
			routes = append(routes, r)
		}
	}
	if len(routes) == 0 {
		return nil, fmt.Errorf("no input stream for agent %q and branch %q", f.Agent, f.Branch)
	}
	s := &pendingScan{in: in, issue: issue}
	if err := s.summaries(ctx, routes); err != nil { // 1.
		return nil, err
	}
	if err := s.entries(ctx); err != nil { // 2.
		return nil, err
	}
	if err := s.issues(ctx); err != nil { // 3.
		return nil, err
	}
	if err := s.leases(ctx); err != nil { // 4.
		return nil, err
	}
	s.classify()
	return s.groups, nil
}

// pendingRef names one pending entry: raw[g][e] of a pendingScan.
type pendingRef struct{ g, e int }

// consumerOf names one consumer of the group groups[g] of a pendingScan.
type consumerOf struct {
	g        int
	consumer string
}

// pendingScan is one run of Pending, its numbered steps as methods: each step fills
// the fields the next one reads.
type pendingScan struct {
	in    *Inspector
	issue string // the canonical issue filter, "" for every issue

	groups []GroupPending // step 1: one per existing group (or stream without one)
	live   []event.Route  // step 1: the route of groups[i]
	pres   presence       // step 1: the workers' presence

	raw [][]redis.XPendingExt // step 2: the pending entries of groups[i]

	refs    []pendingRef          // step 3: every entry of raw, in order
	keys    map[pendingRef]string // step 3: the issue key an entry names
	present map[pendingRef]bool   // step 3: the entry is still in its stream

	held map[lease.Ref]lease.Info // step 4: the live leases of those issues
}

// summaries is step 1: the XPENDING summaries of all groups, their streams' lengths
// and delayed events and the workers' presence, in one round trip.
func (s *pendingScan) summaries(ctx context.Context, routes []event.Route) error {
	pipe := s.in.rdb.Pipeline()
	sums := make([]*redis.XPendingCmd, len(routes))
	delayed := make([]*redis.ZSliceCmd, len(routes))
	lens := make([]*redis.IntCmd, len(routes))
	for i, r := range routes {
		sums[i] = pipe.XPending(ctx, r.Stream, r.Group)
		lens[i] = pipe.XLen(ctx, r.Stream)
		delayed[i] = delayq.QueueList(ctx, pipe, r.Stream, maxDelayedShown)
	}
	readPresence := s.in.queuePresence(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !isNoGroupErr(err) {
		return fmt.Errorf("xpending: %w", err)
	}
	pres, err := readPresence()
	if err != nil {
		return err
	}
	s.pres = pres
	for i, r := range routes {
		sum, err := sums[i].Result()
		if isNoGroupErr(err) {
			// No group: no worker ever read the stream. Its entries wait for one
			// (when there are any, and the issue filter does not hide them).
			if n := lens[i].Val(); n > 0 && s.issue == "" {
				g := newGroupPending(r)
				g.NoGroup, g.Waiting = true, n
				s.groups = append(s.groups, g)
				s.live = append(s.live, r)
			}
			continue
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("xpending %s %s: %w", r.Stream, r.Group, err)
		}
		g := newGroupPending(r)
		for _, d := range delayq.Decode(r.Stream, delayed[i].Val()) {
			if s.issue == "" || d.IssueKey == s.issue {
				g.Delayed = append(g.Delayed, d)
			}
		}
		if sum != nil {
			g.Count, g.Lowest, g.Highest = sum.Count, sum.Lower, sum.Higher
			for name, n := range sum.Consumers {
				g.Consumers = append(g.Consumers, ConsumerPending{Name: name, Pending: n})
			}
			sort.Slice(g.Consumers, func(a, b int) bool { return g.Consumers[a].Name < g.Consumers[b].Name })
		}
		s.groups = append(s.groups, g)
		s.live = append(s.live, r)
	}
	return nil
}

// newGroupPending is r's group with empty (not nil) lists, so JSON shows [].
func newGroupPending(r event.Route) GroupPending {
	return GroupPending{Stream: r.Stream, Group: r.Group, Agent: r.Agent, Branch: r.Branch, Todo: r.Todo,
		Consumers: []ConsumerPending{}, Entries: []PendingEntry{}, Delayed: []DelayedEvent{}}
}

// entries is step 2: the entries, extended XPENDING in pages, the pages of all
// groups pipelined.
func (s *pendingScan) entries(ctx context.Context) error {
	s.raw = make([][]redis.XPendingExt, len(s.groups))
	start := make([]string, len(s.groups))
	todo := map[int]bool{}
	for i := range s.groups {
		start[i] = "-"
		if s.groups[i].Count > 0 {
			todo[i] = true
		}
	}
	for len(todo) > 0 {
		pipe := s.in.rdb.Pipeline()
		cmds := map[int]*redis.XPendingExtCmd{}
		for i := range todo {
			cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.live[i].Stream, Group: s.live[i].Group,
				Start: start[i], End: "+", Count: s.in.page})
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !isNoGroupErr(err) {
			return fmt.Errorf("xpending: %w", err)
		}
		for i, c := range cmds {
			page, err := c.Result()
			if err != nil && !errors.Is(err, redis.Nil) && !isNoGroupErr(err) {
				return fmt.Errorf("xpending %s %s: %w", s.live[i].Stream, s.live[i].Group, err)
			}
			s.raw[i] = append(s.raw[i], page...)
			if int64(len(page)) < s.in.page {
				delete(todo, i)
				continue
			}
			start[i] = "(" + page[len(page)-1].ID
		}
	}
	return nil
}

// issues is step 3: the entries' issue keys, XRANGE id id, pipelined in batches.
func (s *pendingScan) issues(ctx context.Context) error {
	for g := range s.raw {
		for e := range s.raw[g] {
			s.refs = append(s.refs, pendingRef{g, e})
		}
	}
	s.keys = make(map[pendingRef]string, len(s.refs))
	s.present = make(map[pendingRef]bool, len(s.refs))
	const batch = 1000
	for lo := 0; lo < len(s.refs); lo += batch {
		hi := min(lo+batch, len(s.refs))
		pipe := s.in.rdb.Pipeline()
		cmds := make([]*redis.XMessageSliceCmd, hi-lo)
		for k, rf := range s.refs[lo:hi] {
			id := s.raw[rf.g][rf.e].ID
			cmds[k] = pipe.XRangeN(ctx, s.live[rf.g].Stream, id, id, 1)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("read pending entries: %w", err)
		}
		for k, rf := range s.refs[lo:hi] {
			msgs := cmds[k].Val()
			if len(msgs) == 0 {
				continue
			}
			s.present[rf] = true
			s.keys[rf] = event.EntryIssue(s.live[rf.g].Stream, msgs[0].ID, msgs[0].Values)
		}
	}
	return nil
}

// leases is step 4: the leases of those issues, one pipelined batch.
func (s *pendingScan) leases(ctx context.Context) error {
	var refs []lease.Ref
	for _, rf := range s.refs {
		if k, ok := s.in.canonical(s.keys[rf]); ok {
			refs = append(refs, lease.Ref{Agent: s.live[rf.g].Agent, Issue: k})
		}
	}
	held, err := s.in.locker.InspectMany(ctx, refs)
	if err != nil {
		return err
	}
	s.held = held
	return nil
}

// classify is step 5: each entry's state and note, filed in its group.
func (s *pendingScan) classify() {
	running := s.running()
	for _, rf := range s.refs {
		x := s.raw[rf.g][rf.e]
		key, valid := s.in.canonical(s.keys[rf])
		if s.issue != "" && key != s.issue {
			continue
		}
		e := s.guard(rf, key, valid)
		if e.State == StateOrphaned && s.present[rf] && valid {
			s.queue(&e, rf, running[consumerOf{rf.g, x.Consumer}])
		}
		s.groups[rf.g].Entries = append(s.groups[rf.g].Entries, e)
	}
}

// running is the entry each consumer runs now: the one its issue's live lease names.
func (s *pendingScan) running() map[consumerOf]string {
	running := map[consumerOf]string{}
	for _, rf := range s.refs {
		x := s.raw[rf.g][rf.e]
		if k, ok := s.in.canonical(s.keys[rf]); ok {
			if info, ok := s.held[lease.Ref{Agent: s.live[rf.g].Agent, Issue: k}]; ok && info.Guards(s.live[rf.g].Stream, x.ID) {
				running[consumerOf{rf.g, x.Consumer}] = x.ID
			}
		}
	}
	return running
}

// entryName is the entry a lease guards, in words: its id, and its stream if named.
func entryName(info lease.Info) string {
	if info.Stream == "" {
		return info.MessageID
	}
	return info.MessageID + " of " + info.Stream
}

// guard is the entry rf as the leases see it: StateGuarded when its issue's live
// lease names it, else StateOrphaned with a note saying why no lease guards it.
func (s *pendingScan) guard(rf pendingRef, key string, valid bool) PendingEntry {
	x := s.raw[rf.g][rf.e]
	e := PendingEntry{ID: x.ID, Consumer: x.Consumer, Idle: x.Idle, Deliveries: x.RetryCount, Issue: key,
		State: StateOrphaned}
	switch {
	case !s.present[rf]:
		e.Note = "entry no longer in the stream (trimmed or deleted); acked when claimed"
	case key == "":
		e.Note = "entry names no issue; dead-lettered when claimed"
	case !valid:
		e.Note = "invalid issue key; dead-lettered when claimed"
	default:
		info, ok := s.held[lease.Ref{Agent: s.live[rf.g].Agent, Issue: key}]
		if !ok {
			break
		}
		li := s.in.leaseInfo(info)
		e.Lease = &li
		switch {
		case info.Guards(s.live[rf.g].Stream, x.ID):
			e.State = StateGuarded
		case info.MessageID == "":
			e.Note = "issue held by a lock without a message id; dropped if still locked when claimed"
		default:
			e.Note = "issue held for another entry (" + entryName(info) + "); dropped if still locked when claimed"
		}
	}
	return e
}

// queue turns an orphan e into StateQueued when its consumer's worker is alive: it
// was read ahead and waits behind runningID (the entry that worker runs, if known).
func (s *pendingScan) queue(e *PendingEntry, rf pendingRef, runningID string) {
	w, ok := s.pres.of(s.live[rf.g].Stream, s.live[rf.g].Group, e.Consumer)
	if !ok || !w.Alive {
		return
	}
	e.State = StateQueued
	why := e.Note
	e.Note = "queued on a live worker (" + w.String() + "), next after its current entry"
	if runningID != "" {
		e.Note = "queued behind " + runningID + " on a live worker (" + w.String() + ")"
	}
	if e.Lease != nil {
		e.Note += "; its issue is held for entry " + e.Lease.MessageID + ": dropped if still held when its turn comes"
	} else if why != "" {
		e.Note += "; " + why
	}
}
