package fetcher

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// StageIssueScope is the Outcome.Stage of an issue skipped because its shared issue key
// (LOCK_SCOPE issue) is held: a run of some agent that shares it is on the issue.
const StageIssueScope = "issue-scope"

// publishScript appends an entry unless the issue's marker names one still waiting, and
// points the marker at the new entry, atomically. It appends without MAXLEN: trimming is
// event.Trim's, which never cuts an entry a group still needs.
// It also files the new entry in the issue's index of the stream (xonce.IndexKey), as
// every other writer does. KEYS[1] marker, KEYS[2] stream, KEYS[3..4] the index and its
// start; ARGV[1] group, ARGV[2] marker TTL (ms), ARGV[3] the message UUID field
// (event.FieldUUID), ARGV[4..5] the index's bounds, ARGV[6..] field, value, ...
// Returns {0, waiting id} or {1, new id}.
var publishScript = redis.NewScript(publishLua)

//go:embed scripts/publish.lua
var publishLua string

// marker is a parsed queued marker: the entry last published for an issue, as
// "<entry id> <stream> <uuid>" (the fetcher's) or "<entry id> <stream>" (what a producer
// of downstream requests may write).
type marker struct {
	id, stream string
	// uuid is the entry's message UUID; "" when the marker has none. Ids alone do not
	// name an entry for good: a stream deleted and created again restarts its ids from
	// its first XADD's millisecond, so an entry of the new stream can carry the very id
	// of one of the old stream.
	uuid string
}

func parseMarker(v string) (marker, bool) {
	parts := strings.Split(v, " ")
	if len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") {
		return marker{}, false
	}
	if _, ok := streamid.ParseFull(parts[0]); !ok {
		return marker{}, false
	}
	m := marker{id: parts[0], stream: parts[1]}
	if len(parts) == 3 {
		m.uuid = parts[2]
	}
	return m, true
}

// names says whether the entry read at the marker's id (XRANGE id id) is the one the
// marker names; entry is nil when there is none. A marker without a UUID names whatever
// entry has its id.
func (m marker) names(entry *redis.XMessage) bool {
	if entry == nil || entry.ID != m.id {
		return false
	}
	if m.uuid == "" {
		return true
	}
	v, _ := entry.Values[event.FieldUUID].(string)
	return v == m.uuid
}

// precheckResult is what one batch pre-check found.
type precheckResult struct {
	// locked maps an issue to the first stage whose lease on it is alive.
	locked map[string]string
	// queued maps an issue to the id of its entry still waiting in a stream.
	queued map[string]string
	// roundTrips is how many round trips the pre-check took: 1, or 2 when some issue had
	// a queued marker (to renew it, and to confirm an entry already delivered is pending).
	roundTrips int
}

// streamState is what the pre-check learnt about one stream.
type streamState struct {
	exists   bool
	last     streamid.ID // the group's last-delivered-id
	hasGroup bool
}

// mgetChunk bounds the keys of one MGET, so that one command never holds the server for
// long; the chunks still go in one pipeline, one round trip.
const mgetChunk = 1024

// precheck decides, for a batch of candidate issues, which are locked at some stage and
// which already wait in a stream. Round trip 1 is ONE pipeline for the whole batch, never
// a SCAN: the lease key of every stage for every issue (Locker.LockKey(agent, issue))
// and every issue's triage marker are point lookups, sent as MGETs of up to mgetChunk keys
// (a lease exists iff its slot is not nil: EXISTS that also says which stage, at a quarter
// of the cost of one EXISTS per key), plus, per triage stream, the triage group's
// last-delivered-id. Issues in downstream also get their downstream stages' markers read,
// with those streams' states. Round trip 2 happens only when some marker was found: it
// renews the markers' TTL and reads the entry each marker names (XRANGE id id, O(log n)),
// which must still be in the stream and be the marker's own (marker.names); for entries
// already delivered to the group (of issues that are not locked) it also asks XPENDING
// about that single id. A marker whose entry is after the group's last-delivered-id (or
// whose group does not exist yet) is unread: queued; one whose entry was delivered is
// queued while pending.
func (f *Fetcher) precheck(ctx context.Context, keys []string, downstream map[string]bool) (precheckResult, error) {
	res := precheckResult{locked: map[string]string{}, queued: map[string]string{}}
	if len(keys) == 0 {
		return res, nil
	}
	// 1. The keys to look up: every stage's lease, the shared key and the markers.
	lookups, slots := f.precheckLookups(keys, downstream)
	streams := f.triageStreams()
	if len(downstream) > 0 {
		for _, r := range f.topo.AllInputs() {
			if r.Agent != triageAgent {
				streams = append(streams, r.Stream)
			}
		}
	}
	// 2. Round trip 1: their values and the streams' groups.
	values, state, err := f.precheckRead(ctx, lookups, streams)
	res.roundTrips = 1
	if err != nil {
		return res, err
	}
	// 3. The locked issues, and the markers found.
	var markers []foundMarker
	for i, v := range values {
		sl := slots[i]
		if v == nil {
			continue
		}
		if sl.stage != "" {
			if _, ok := res.locked[sl.issue]; !ok {
				res.locked[sl.issue] = sl.stage
			}
			continue
		}
		str, _ := v.(string)
		if m, ok := parseMarker(str); ok {
			markers = append(markers, foundMarker{issue: sl.issue, key: lookups[i], m: m})
		}
	}
	if len(markers) == 0 {
		return res, nil
	}
	// 4. Round trip 2: renew the markers, read the entries they name.
	f.precheckConfirm(ctx, markers, state, res.locked)
	res.roundTrips = 2
	// 5. The issues whose marker's entry still waits.
	for _, c := range markers {
		queued, err := c.waiting()
		if err != nil {
			return res, err
		}
		if queued {
			res.queued[c.issue] = c.m.id
		}
	}
	return res, nil
}

// precheckSlot says what one looked-up key of the pre-check is: a lease (stage != "")
// or a marker.
type precheckSlot struct {
	issue, stage, marker string
}

// precheckLookups is step 1 of precheck: the keys to read for keys, and what each is.
func (f *Fetcher) precheckLookups(keys []string, downstream map[string]bool) ([]string, []precheckSlot) {
	per := len(f.stages) + 2
	lookups := make([]string, 0, len(keys)*per)
	slots := make([]precheckSlot, 0, len(keys)*per)
	add := func(key string, sl precheckSlot) {
		lookups = append(lookups, key)
		slots = append(slots, sl)
	}
	for _, k := range keys {
		for _, a := range f.stages {
			add(f.locker.LockKey(a, k), precheckSlot{issue: k, stage: a})
		}
		// The issue's shared key (LOCK_SCOPE issue): held by a run of any agent that
		// shares it, so the issue is locked for all of them.
		add(f.locker.SharedKeys(lease.ScopeKey{Scope: lease.ScopeIssue, Key: k}).Lock, precheckSlot{issue: k, stage: StageIssueScope})
		if f.cluster {
			// One marker beside each triage stream (markerKey): both are read.
			for _, st := range f.triageStreams() {
				add(f.markerKey(st, k), precheckSlot{issue: k, marker: triageAgent})
			}
		} else {
			add(f.topo.Queued(triageAgent, k), precheckSlot{issue: k, marker: triageAgent})
		}
		if !downstream[k] {
			continue
		}
		for _, a := range f.stages {
			if a != triageAgent {
				add(f.topo.Queued(a, k), precheckSlot{issue: k, marker: a})
			}
		}
	}
	return lookups, slots
}

// precheckRead is step 2 of precheck, its round trip 1: the value of each lookup (nil
// when absent) and the state of each stream.
func (f *Fetcher) precheckRead(ctx context.Context, lookups, streams []string) ([]any, map[string]streamState, error) {
	var mgets []*redis.SliceCmd
	var gets []*redis.StringCmd
	infos := make([]*redis.XInfoGroupsCmd, len(streams))
	_, _ = f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if f.cluster {
			// The keys are in many slots, where MGET is refused (CROSSSLOT): one GET
			// each, which the cluster pipeline sends to each node in one round trip,
			// all nodes at once.
			for _, k := range lookups {
				gets = append(gets, p.Get(ctx, k))
			}
		}
		for i := 0; !f.cluster && i < len(lookups); i += mgetChunk {
			mgets = append(mgets, p.MGet(ctx, lookups[i:min(i+mgetChunk, len(lookups))]...))
		}
		for i, s := range streams {
			infos[i] = p.XInfoGroups(ctx, s)
		}
		return nil
	})
	values := make([]any, 0, len(lookups))
	for _, c := range gets {
		v, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			values = append(values, nil)
		case err != nil:
			return nil, nil, fmt.Errorf("lock pre-check: %w", err)
		default:
			values = append(values, v)
		}
	}
	for _, c := range mgets {
		v, err := c.Result()
		if err != nil {
			return nil, nil, fmt.Errorf("lock pre-check: %w", err)
		}
		values = append(values, v...)
	}
	if len(values) != len(lookups) {
		return nil, nil, fmt.Errorf("lock pre-check: %d values for %d keys", len(values), len(lookups))
	}
	state := make(map[string]streamState, len(streams))
	for i, s := range streams {
		st, err := f.streamStateOf(s, infos[i])
		if err != nil {
			return nil, nil, err
		}
		state[s] = st
	}
	return values, state, nil
}

// streamStateOf reads stream s's state from its XINFO GROUPS reply.
func (f *Fetcher) streamStateOf(s string, info *redis.XInfoGroupsCmd) (streamState, error) {
	var st streamState
	groups, err := info.Result()
	switch {
	case isNoSuchKey(err):
		return st, nil // gone: nothing waits in it
	case err != nil:
		return st, fmt.Errorf("queued pre-check: XINFO GROUPS %s: %w", s, err)
	}
	st.exists = true
	group := f.groupOf(s)
	for _, g := range groups {
		if id, ok := streamid.ParseFull(g.LastDeliveredID); ok && g.Name == group {
			st.last, st.hasGroup = id, true
		}
	}
	return st, nil
}

// foundMarker is a queued marker the pre-check found, and what round trip 2 read of
// the entry it names.
type foundMarker struct {
	issue, key string
	m          marker
	unread     bool
	entry      *redis.XMessageSliceCmd
	pend       *redis.XPendingExtCmd
}

// precheckConfirm is step 4 of precheck, its round trip 2: it renews each marker's TTL
// and queues the reads of the entry it names (and, for an entry already delivered, of
// its pending state), unless the issue is locked anyway.
func (f *Fetcher) precheckConfirm(ctx context.Context, markers []foundMarker, state map[string]streamState, locked map[string]string) {
	_, _ = f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range markers {
			c := &markers[i]
			p.PExpire(ctx, c.key, f.queuedTTL)
			st, known := state[c.m.stream]
			if !known || !st.exists {
				continue
			}
			c.unread = !st.hasGroup || mustID(c.m.id).After(st.last)
			if !c.unread && locked[c.issue] != "" {
				continue // skipped as locked whatever the entry's state
			}
			c.entry = p.XRangeN(ctx, c.m.stream, c.m.id, c.m.id, 1)
			if !c.unread {
				c.pend = p.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: c.m.stream, Group: f.groupOf(c.m.stream),
					Start: c.m.id, End: c.m.id, Count: 1})
			}
		}
		return nil
	})
}

// waiting is step 5 of precheck for one marker: whether the entry it names still waits
// (unread and the marker's own, or pending), from what precheckConfirm read.
func (c foundMarker) waiting() (bool, error) {
	if c.entry == nil {
		return false, nil
	}
	xs, err := c.entry.Result()
	if err != nil && !isNoSuchKey(err) {
		return false, fmt.Errorf("queued pre-check: XRANGE %s: %w", c.m.stream, err)
	}
	var entry *redis.XMessage
	if len(xs) > 0 {
		entry = &xs[0]
	}
	if c.unread {
		return c.m.names(entry), nil
	}
	pe, err := c.pend.Result()
	switch {
	case err != nil && (isNoSuchKey(err) || redis.HasErrorPrefix(err, "NOGROUP")):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("queued pre-check: XPENDING %s: %w", c.m.stream, err)
	}
	// Pending: its worker has it, even if the entry was deleted since (then nothing
	// tells whose it was, and it counts as the marker's).
	return len(pe) > 0 && (entry == nil || c.m.names(entry)), nil
}

func mustID(s string) streamid.ID {
	id, _ := streamid.ParseFull(s)
	return id
}

// publish appends fields to stream unless key's marker names an entry still waiting, in
// one atomic script (one round trip). It returns the entry id and whether it is new.
func (f *Fetcher) publish(ctx context.Context, key, stream string, fields map[string]any) (string, bool, error) {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	args := make([]any, 0, 5+2*len(names))
	args = append(args, f.group, f.queuedTTL.Milliseconds(), event.FieldUUID, xonce.IndexMax, xonce.IndexTTL.Milliseconds())
	for _, k := range names {
		args = append(args, k, fields[k])
	}
	v, err := publishScript.Run(ctx, f.rdb, []string{f.markerKey(stream, key), stream,
		xonce.IndexKey(stream, key), xonce.IndexSinceKey(stream)}, args...).Slice()
	if err != nil {
		return "", false, err
	}
	if len(v) != 2 {
		return "", false, fmt.Errorf("publish script: unexpected reply %v", v)
	}
	n, _ := v[0].(int64)
	id, _ := v[1].(string)
	return id, n == 1, nil
}

// markerKey is the key of issue's triage marker for a publish to stream. On standalone
// Redis it is one marker for both triage streams, event.Topology.Queued (so a request
// waiting in either stream keeps a second one out, atomically). On Redis Cluster the
// publish script may touch one slot only, so each triage stream has its own marker in
// its slot (event.Topology.QueuedBeside); the pre-check reads both, so a sweep still
// publishes nothing while a request waits in the other stream, but two processes racing
// to publish one issue to the two streams at once can both succeed there (the lease
// still runs them one after the other).
func (f *Fetcher) markerKey(stream, issue string) string {
	if f.cluster {
		return f.topo.QueuedBeside(stream, triageAgent, issue)
	}
	return f.topo.Queued(triageAgent, issue)
}

func isNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}
