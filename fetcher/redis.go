package fetcher

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// luaWaiting decides whether the entry a queued marker names is still waiting for the
// triage group: unread (after the group's last-delivered-id, or the group does not exist
// yet, which the workers create from id 0) and still in the stream, or pending (delivered,
// not acked). A waiting marker's TTL is renewed. The marker is "<entry id> <stream>".
const luaWaiting = `
local function idgt(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return false end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  if am ~= bm then return am > bm end
  return as > bs
end

local function waiting(marker, group, ttl)
  local v = redis.call('GET', marker)
  if not v then return false end
  local id, stream = string.match(v, '^(%S+) (%S+)$')
  if not id then return false end
  if redis.call('EXISTS', stream) == 0 then return false end
  local last = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, ld = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end
    end
    if name == group then last = ld end
  end
  local w
  if last == nil or idgt(id, last) then
    w = #redis.call('XRANGE', stream, id, id, 'COUNT', 1) > 0
  else
    w = #redis.call('XPENDING', stream, group, id, id, 1) > 0
  end
  if w then redis.call('PEXPIRE', marker, ttl) end
  return w and id
end
`

// publishScript appends an entry unless the marker names one still waiting, and
// points the marker at the new entry, atomically.
// KEYS[1] marker, KEYS[2] stream; ARGV[1] group, ARGV[2] marker TTL (ms), ARGV[3] MAXLEN
// (0: no trim), ARGV[4..] field, value, ... Returns {0, waiting id} or {1, new id}.
var publishScript = redis.NewScript(luaWaiting + `
local cur = waiting(KEYS[1], ARGV[1], ARGV[2])
if cur then return {0, cur} end
local args = {'XADD', KEYS[2]}
if tonumber(ARGV[3]) > 0 then
  table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[3])
end
table.insert(args, '*')
for i = 4, #ARGV do table.insert(args, ARGV[i]) end
local id = redis.call(unpack(args))
redis.call('SET', KEYS[1], id .. ' ' .. KEYS[2], 'PX', ARGV[2])
return {1, id}
`)

// streamID is a parsed stream entry id.
type streamID struct{ ms, seq uint64 }

func parseStreamID(s string) (streamID, bool) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return streamID{}, false
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return streamID{}, false
	}
	return streamID{ms, seq}, true
}

func (a streamID) after(b streamID) bool {
	if a.ms != b.ms {
		return a.ms > b.ms
	}
	return a.seq > b.seq
}

// marker is a parsed queued marker: the entry last published for an issue.
type marker struct{ id, stream string }

func parseMarker(v string) (marker, bool) {
	id, stream, ok := strings.Cut(v, " ")
	if !ok || id == "" || stream == "" {
		return marker{}, false
	}
	if _, ok := parseStreamID(id); !ok {
		return marker{}, false
	}
	return marker{id, stream}, true
}

// precheckResult is what one batch pre-check found.
type precheckResult struct {
	// locked maps an issue to the first stage whose lease on it is alive.
	locked map[string]string
	// queued maps an issue to the id of its entry still waiting in a stream.
	queued map[string]string
	// roundTrips is how many round trips the pre-check took: 1, or 2 when some unlocked
	// issue's marker names an entry already delivered to its group (pending or acked).
	roundTrips int
}

// streamState is what the pre-check learnt about one stream.
type streamState struct {
	exists   bool
	first    streamID // the oldest entry still in the stream
	hasFirst bool
	last     streamID // the group's last-delivered-id
	hasGroup bool
}

// precheck reads, in ONE pipelined round trip for the whole batch, the lease key of every
// stage for every issue (EXISTS, never SCAN), every issue's triage marker (GETEX, renewing
// its TTL), and per triage stream its oldest entry and the triage group's
// last-delivered-id. Issues in downstream also get their downstream stages' markers read,
// with those streams' states. A marker whose entry is after the group's last-delivered-id
// (or whose group does not exist yet) and not older than the stream's oldest entry is
// unread: queued. Only markers at or before the last-delivered-id of issues that are not
// locked need a second pipelined round trip: XPENDING of that single id, O(log n).
func (f *Fetcher) precheck(ctx context.Context, keys []string, downstream map[string]bool) (precheckResult, error) {
	res := precheckResult{locked: map[string]string{}, queued: map[string]string{}}
	if len(keys) == 0 {
		return res, nil
	}
	type markerCmd struct {
		key string
		cmd *redis.StringCmd
	}
	stages := f.stages
	exists := make([]*redis.IntCmd, 0, len(keys)*len(stages))
	markers := make([]markerCmd, 0, len(keys))
	streams := f.triageStreams()
	if len(downstream) > 0 {
		for _, r := range f.topo.AllInputs() {
			if r.Agent != triageAgent {
				streams = append(streams, r.Stream)
			}
		}
	}
	infos := make([]*redis.XInfoGroupsCmd, len(streams))
	firsts := make([]*redis.XMessageSliceCmd, len(streams))
	_, _ = f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			for _, a := range stages {
				exists = append(exists, p.Exists(ctx, f.locker.Keys(a, k).Lock))
			}
			markers = append(markers, markerCmd{k, p.GetEx(ctx, f.queuedKey(triageAgent, k), f.queuedTTL)})
			if downstream[k] {
				for _, a := range stages {
					if a != triageAgent {
						markers = append(markers, markerCmd{k, p.GetEx(ctx, f.queuedKey(a, k), f.queuedTTL)})
					}
				}
			}
		}
		for i, s := range streams {
			infos[i] = p.XInfoGroups(ctx, s)
			firsts[i] = p.XRangeN(ctx, s, "-", "+", 1)
		}
		return nil
	})
	res.roundTrips = 1
	for i, k := range keys {
		for j, a := range stages {
			n, err := exists[i*len(stages)+j].Result()
			if err != nil {
				return res, fmt.Errorf("lock pre-check: %w", err)
			}
			if n > 0 {
				res.locked[k] = a
				break
			}
		}
	}
	state := make(map[string]streamState, len(streams))
	for i, s := range streams {
		var st streamState
		groups, err := infos[i].Result()
		switch {
		case isNoSuchKey(err):
			state[s] = st // gone: nothing waits in it
			continue
		case err != nil:
			return res, fmt.Errorf("queued pre-check: XINFO GROUPS %s: %w", s, err)
		}
		st.exists = true
		group := f.groupOf(s)
		for _, g := range groups {
			if id, ok := parseStreamID(g.LastDeliveredID); ok && g.Name == group {
				st.last, st.hasGroup = id, true
			}
		}
		xs, err := firsts[i].Result()
		if err != nil {
			return res, fmt.Errorf("queued pre-check: XRANGE %s: %w", s, err)
		}
		if len(xs) > 0 {
			st.first, st.hasFirst = mustID(xs[0].ID), true
		}
		state[s] = st
	}

	type confirm struct {
		key  string
		m    marker
		pend *redis.XPendingExtCmd
	}
	var delivered []confirm
	for _, mc := range markers {
		v, err := mc.cmd.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("queued pre-check: %w", err)
		}
		m, ok := parseMarker(v)
		if !ok {
			continue
		}
		st, known := state[m.stream]
		if !known || !st.exists {
			continue
		}
		id := mustID(m.id)
		switch {
		case !st.hasGroup || id.after(st.last):
			// Unread, unless trimmed away.
			if st.hasFirst && !st.first.after(id) {
				res.queued[mc.key] = m.id
			}
		case res.locked[mc.key] == "":
			delivered = append(delivered, confirm{key: mc.key, m: m})
		}
	}
	if len(delivered) == 0 {
		return res, nil
	}
	_, _ = f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range delivered {
			c := &delivered[i]
			c.pend = p.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: c.m.stream, Group: f.groupOf(c.m.stream), Start: c.m.id, End: c.m.id, Count: 1})
		}
		return nil
	})
	res.roundTrips = 2
	for _, c := range delivered {
		pe, err := c.pend.Result()
		switch {
		case err != nil && (isNoSuchKey(err) || redis.HasErrorPrefix(err, "NOGROUP")):
		case err != nil:
			return res, fmt.Errorf("queued pre-check: XPENDING %s: %w", c.m.stream, err)
		case len(pe) > 0:
			res.queued[c.key] = c.m.id
		}
	}
	return res, nil
}

func mustID(s string) streamID {
	id, _ := parseStreamID(s)
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
	args := make([]any, 0, 3+2*len(names))
	args = append(args, f.group, f.queuedTTL.Milliseconds(), f.maxLen)
	for _, k := range names {
		args = append(args, k, fields[k])
	}
	v, err := publishScript.Run(ctx, f.rdb, []string{f.queuedKey(triageAgent, key), stream}, args...).Slice()
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

func isNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}
