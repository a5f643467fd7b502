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
	Delayed []event.DelayedEvent `json:"delayed"`
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
// presence beat, event.WorkerBeat): it was read ahead and waits behind the entry the
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

	// 1. The summaries, all groups in one round trip.
	pipe := in.rdb.Pipeline()
	sums := make([]*redis.XPendingCmd, len(routes))
	delayed := make([]*redis.ZSliceCmd, len(routes))
	lens := make([]*redis.IntCmd, len(routes))
	for i, r := range routes {
		sums[i] = pipe.XPending(ctx, r.Stream, r.Group)
		lens[i] = pipe.XLen(ctx, r.Stream)
		delayed[i] = event.QueueListDelayed(ctx, pipe, r.Stream, maxDelayedShown)
	}
	readPresence := in.queuePresence(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !isNoGroupErr(err) {
		return nil, fmt.Errorf("xpending: %w", err)
	}
	pres, err := readPresence()
	if err != nil {
		return nil, err
	}
	var groups []GroupPending
	var live []event.Route
	for i, r := range routes {
		s, err := sums[i].Result()
		if isNoGroupErr(err) {
			// No group: no worker ever read the stream. Its entries wait for one
			// (when there are any, and the issue filter does not hide them).
			if n := lens[i].Val(); n > 0 && issue == "" {
				groups = append(groups, GroupPending{Stream: r.Stream, Group: r.Group, Agent: r.Agent, Branch: r.Branch, Todo: r.Todo,
					Consumers: []ConsumerPending{}, Entries: []PendingEntry{}, Delayed: []event.DelayedEvent{}, NoGroup: true, Waiting: n})
				live = append(live, r)
			}
			continue
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("xpending %s %s: %w", r.Stream, r.Group, err)
		}
		g := GroupPending{Stream: r.Stream, Group: r.Group, Agent: r.Agent, Branch: r.Branch, Todo: r.Todo,
			Consumers: []ConsumerPending{}, Entries: []PendingEntry{}, Delayed: []event.DelayedEvent{}}
		for _, d := range event.DecodeDelayed(r.Stream, delayed[i].Val()) {
			if issue == "" || d.IssueKey == issue {
				g.Delayed = append(g.Delayed, d)
			}
		}
		if s != nil {
			g.Count, g.Lowest, g.Highest = s.Count, s.Lower, s.Higher
			for name, n := range s.Consumers {
				g.Consumers = append(g.Consumers, ConsumerPending{Name: name, Pending: n})
			}
			sort.Slice(g.Consumers, func(a, b int) bool { return g.Consumers[a].Name < g.Consumers[b].Name })
		}
		groups = append(groups, g)
		live = append(live, r)
	}

	// 2. The entries: extended XPENDING in pages, the pages of all groups pipelined.
	raw := make([][]redis.XPendingExt, len(groups))
	start := make([]string, len(groups))
	todo := map[int]bool{}
	for i := range groups {
		start[i] = "-"
		if groups[i].Count > 0 {
			todo[i] = true
		}
	}
	for len(todo) > 0 {
		pipe := in.rdb.Pipeline()
		cmds := map[int]*redis.XPendingExtCmd{}
		for i := range todo {
			cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: live[i].Stream, Group: live[i].Group,
				Start: start[i], End: "+", Count: in.page})
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) && !isNoGroupErr(err) {
			return nil, fmt.Errorf("xpending: %w", err)
		}
		for i, c := range cmds {
			page, err := c.Result()
			if err != nil && !errors.Is(err, redis.Nil) && !isNoGroupErr(err) {
				return nil, fmt.Errorf("xpending %s %s: %w", live[i].Stream, live[i].Group, err)
			}
			raw[i] = append(raw[i], page...)
			if int64(len(page)) < in.page {
				delete(todo, i)
				continue
			}
			start[i] = "(" + page[len(page)-1].ID
		}
	}

	// 3. The entries' issue keys: XRANGE id id, pipelined in batches.
	type ref struct{ g, e int }
	var refs []ref
	for g := range raw {
		for e := range raw[g] {
			refs = append(refs, ref{g, e})
		}
	}
	issues := make(map[ref]string, len(refs))
	present := make(map[ref]bool, len(refs))
	const batch = 1000
	for lo := 0; lo < len(refs); lo += batch {
		hi := min(lo+batch, len(refs))
		pipe := in.rdb.Pipeline()
		cmds := make([]*redis.XMessageSliceCmd, hi-lo)
		for k, rf := range refs[lo:hi] {
			id := raw[rf.g][rf.e].ID
			cmds[k] = pipe.XRangeN(ctx, live[rf.g].Stream, id, id, 1)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read pending entries: %w", err)
		}
		for k, rf := range refs[lo:hi] {
			msgs := cmds[k].Val()
			if len(msgs) == 0 {
				continue
			}
			present[rf] = true
			issues[rf] = event.EntryIssue(live[rf.g].Stream, msgs[0].ID, msgs[0].Values)
		}
	}

	// 4. The leases of those issues, one pipelined batch.
	var leaseRefs []lease.Ref
	for _, rf := range refs {
		if k, ok := in.canonical(issues[rf]); ok {
			leaseRefs = append(leaseRefs, lease.Ref{Agent: live[rf.g].Agent, Issue: k})
		}
	}
	leases, err := in.locker.InspectMany(ctx, leaseRefs)
	if err != nil {
		return nil, err
	}

	// The entry each consumer runs now: the one its issue's live lease names.
	type gc struct {
		g        int
		consumer string
	}
	running := map[gc]string{}
	for _, rf := range refs {
		x := raw[rf.g][rf.e]
		if k, ok := in.canonical(issues[rf]); ok {
			if info, ok := leases[lease.Ref{Agent: live[rf.g].Agent, Issue: k}]; ok && info.MessageID == x.ID {
				running[gc{rf.g, x.Consumer}] = x.ID
			}
		}
	}

	for _, rf := range refs {
		x := raw[rf.g][rf.e]
		key, valid := in.canonical(issues[rf])
		if issue != "" && key != issue {
			continue
		}
		e := PendingEntry{ID: x.ID, Consumer: x.Consumer, Idle: x.Idle, Deliveries: x.RetryCount, Issue: key,
			State: StateOrphaned}
		switch {
		case !present[rf]:
			e.Note = "entry no longer in the stream (trimmed or deleted); acked when claimed"
		case key == "":
			e.Note = "entry names no issue; dead-lettered when claimed"
		case !valid:
			e.Note = "invalid issue key; dead-lettered when claimed"
		default:
			if info, ok := leases[lease.Ref{Agent: live[rf.g].Agent, Issue: key}]; ok {
				li := in.leaseInfo(info)
				e.Lease = &li
				if info.MessageID == x.ID {
					e.State = StateGuarded
				} else {
					e.Note = "issue held for another entry (" + info.MessageID + "); dropped if still locked when claimed"
					if info.MessageID == "" {
						e.Note = "issue held by a lock without a message id; dropped if still locked when claimed"
					}
				}
			}
		}
		if e.State == StateOrphaned && present[rf] && valid {
			if w, ok := pres.of(live[rf.g].Stream, live[rf.g].Group, x.Consumer); ok && w.Alive {
				e.State = StateQueued
				why := e.Note
				e.Note = "queued on a live worker (" + w.String() + "), next after its current entry"
				if id := running[gc{rf.g, x.Consumer}]; id != "" {
					e.Note = "queued behind " + id + " on a live worker (" + w.String() + ")"
				}
				if e.Lease != nil {
					e.Note += "; its issue is held for entry " + e.Lease.MessageID + ": dropped if still held when its turn comes"
				} else if why != "" {
					e.Note += "; " + why
				}
			}
		}
		groups[rf.g].Entries = append(groups[rf.g].Entries, e)
	}
	return groups, nil
}
