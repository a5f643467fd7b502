package lease

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Info is the operator's view of a lease.
type Info struct {
	Agent      string
	Issue      string
	Owner      string
	Fence      int64
	AcquiredAt time.Time
	MessageID  string
	// Stream is the stream of MessageID's entry when the holder's record names it
	// (AcquireOptions.Stream): an agent's stream and its :todo twin repeat entry ids.
	Stream string
	TTL    time.Duration // time left; 0 when unknown
	// Scope is what the key guards: ScopeAgent (the agent's own lease on Issue), or
	// ScopeIssue or ScopeGroup (a shared key, held by Agent's run on Issue); Key is
	// the key it guards (Issue for ScopeAgent).
	Scope Scope
	Key   string
	// Mailbox is the number of follow-ups waiting in the lease's mailbox (deliver
	// policy).
	Mailbox int64
	// Supersedes is the entry whose run this lease took over (supersede policy): its
	// own run starts once that one has stopped.
	Supersedes string
	// Waiting is the number of events in the key's line (wait policy); OldestWaiting
	// when the line's head joined it. Reserved: the key is handed to the line's head,
	// whose copy has not started yet (Owner "line", MessageID its first entry).
	Waiting       int64
	OldestWaiting time.Time
	Reserved      bool
}

// Inspect returns the live lease (agent, rawKey), or ok=false when nobody holds it.
func (l *Locker) Inspect(ctx context.Context, agent, rawKey string) (info Info, ok bool, err error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return Info{}, false, err
	}
	keys := l.Keys(agent, issue)
	pipe := l.rdb.Pipeline()
	ttl := pipe.PTTL(ctx, keys.Lock)
	h := pipe.HGetAll(ctx, keys.Info)
	mail := pipe.XLen(ctx, keys.Mailbox)
	ln := queueLine(ctx, pipe, keys.Line().Line)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Info{}, false, fmt.Errorf("lease: inspect %s: %w", keys.Lock, err)
	}
	if ttl.Val() == -2 { // go-redis passes PTTL's "no such key" through as -2
		return Info{}, false, nil
	}
	info = infoFromHash(agent, issue, h.Val())
	if ttl.Val() > 0 {
		info.TTL = ttl.Val()
	}
	info.Mailbox = mail.Val()
	ln.fill(&info)
	return info, true, nil
}

// InspectShared returns the live shared key sk (scope issue or group; Key canonical),
// naming the agent and issue of the run holding it, or ok=false when nobody holds it.
func (l *Locker) InspectShared(ctx context.Context, sk ScopeKey) (info Info, ok bool, err error) {
	keys := l.SharedKeys(sk)
	infos, err := l.lookupListed(ctx, []listed{{lock: keys.Lock, info: keys.Info, key: sk.Key, scope: sk.Scope}})
	if err != nil || len(infos) == 0 {
		return Info{}, false, err
	}
	return infos[0], true, nil
}

// ForceRelease deletes the lease (agent, rawKey) whoever holds it and bumps its fence,
// so the evicted holder's fenced writes are refused, and announces it: a holder whose
// Locker watches evictions (WatchEvictions) stops at once, any other at its next
// heartbeat. It returns the new fence. Operators only.
func (l *Locker) ForceRelease(ctx context.Context, agent, rawKey string) (int64, error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return 0, err
	}
	keys := l.Keys(agent, issue)
	fence, err := forceReleaseScript.Run(ctx, l.rdb, []string{keys.Lock, keys.Info, keys.Fence}, l.EvictionChannel()).Int64()
	if err != nil {
		return 0, fmt.Errorf("lease: force release %s: %w", keys.Lock, err)
	}
	return fence, nil
}

// Guards reports whether the lease was taken for entry id of stream: its id, in its
// stream when the record names one (an agent's stream and its :todo twin repeat entry
// ids: the other's entry of that id is another event).
func (i Info) Guards(stream, id string) bool {
	return i.MessageID == id && (i.Stream == "" || i.Stream == stream)
}

func infoFromHash(agent, issue string, h map[string]string) Info {
	info := Info{Agent: agent, Issue: issue, Owner: h["owner"], MessageID: lineEventID(h["message_id"]), Stream: h["stream"],
		Scope: ScopeAgent, Key: issue, Supersedes: h["supersedes"]}
	if _, stream, ok := strings.Cut(h["message_id"], " "); ok && info.Stream == "" {
		info.Stream = stream // a key reserved for its line's head names its member: lid and stream
	}
	info.Fence, _ = strconv.ParseInt(h["fence"], 10, 64)
	if ms, _ := strconv.ParseInt(h["acquired_at"], 10, 64); ms > 0 {
		info.AcquiredAt = time.UnixMilli(ms)
	}
	return info
}

// Ref names one lease: an agent and an issue key (raw: it is canonicalised).
type Ref struct {
	Agent string
	Issue string
}

// lookupBatch bounds the commands of one pipelined lookup round trip.
const lookupBatch = 500

// InspectMany looks up many leases at once, without SCAN: three commands per lease (PTTL
// of the lock key, HGETALL of its record, XLEN of its mailbox), pipelined, one round trip per 500 leases.
// It returns the live ones keyed by their canonical Ref; refs with an invalid issue
// key are skipped. A lock key without a record (a Python agent's plain lock) is
// returned with an empty Owner.
func (l *Locker) InspectMany(ctx context.Context, refs []Ref) (map[Ref]Info, error) {
	out := make(map[Ref]Info, len(refs))
	seen := make(map[Ref]bool, len(refs))
	var canon []Ref
	for _, r := range refs {
		issue, err := l.Canonicalize(r.Issue)
		if err != nil {
			continue
		}
		c := Ref{Agent: r.Agent, Issue: issue}
		if !seen[c] {
			seen[c] = true
			canon = append(canon, c)
		}
	}
	for len(canon) > 0 {
		n := min(len(canon), lookupBatch)
		if err := l.lookup(ctx, canon[:n], out); err != nil {
			return nil, err
		}
		canon = canon[n:]
	}
	return out, nil
}

func (l *Locker) lookup(ctx context.Context, refs []Ref, out map[Ref]Info) error {
	pipe := l.rdb.Pipeline()
	ttls := make([]*redis.DurationCmd, len(refs))
	recs := make([]*redis.MapStringStringCmd, len(refs))
	mails := make([]*redis.IntCmd, len(refs))
	lines := make([]lineCmds, len(refs))
	for i, r := range refs {
		keys := l.Keys(r.Agent, r.Issue)
		ttls[i] = pipe.PTTL(ctx, keys.Lock)
		recs[i] = pipe.HGetAll(ctx, keys.Info)
		mails[i] = pipe.XLen(ctx, keys.Mailbox)
		lines[i] = queueLine(ctx, pipe, keys.Line().Line)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("lease: look up %d leases: %w", len(refs), err)
	}
	for i, r := range refs {
		ttl := ttls[i].Val()
		if ttl == -2 { // no such key: not held
			continue
		}
		info := infoFromHash(r.Agent, r.Issue, recs[i].Val())
		if ttl > 0 {
			info.TTL = ttl
		}
		info.Mailbox = mails[i].Val()
		lines[i].fill(&info)
		out[r] = info
	}
	return nil
}

// List returns the live leases of agent ("" for every agent), ordered by agent, issue
// and scope: each agent's own leases and the shared keys (scopes issue and group) its
// runs hold, one Info each. It finds them with SCAN MATCH on the record keys
// (Options.Format.infoPattern under Options.Scope), then reads their TTLs and records,
// pipelined.
//
// Cost: SCAN visits the whole keyspace of the database, not only the lease keys (the
// MATCH filter runs on the server), in steps of 1000 keys, one round trip each; then
// one round trip per 500 leases found. Use InspectMany when the issues are known.
// Python agents' plain lock keys have no record and are not listed. With an empty
// Scope every scope's leases match; their agent then carries the other scope (e.g.
// "staging:triage"), so callers filter on the agents they know.
func (l *Locker) List(ctx context.Context, agent string) ([]Info, error) {
	pattern := l.opts.Format.infoPattern(l.opts.Scope)
	var mu sync.Mutex
	var found []listed
	scan := func(ctx context.Context, c Client) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			scoped, issue, ok := l.opts.Format.parseInfoKey(key)
			if !ok {
				continue
			}
			ag, ok := strings.CutPrefix(scoped, l.opts.Scope)
			if !ok || ag == "" {
				continue
			}
			f := listed{info: key, lock: "lock:" + strings.TrimPrefix(key, "lockinfo:"), agent: ag, key: issue}
			if shared, isShared := strings.CutPrefix(ag, "@"); isShared {
				if shared != string(ScopeIssue) && shared != string(ScopeGroup) {
					continue
				}
				f.scope, f.agent = Scope(shared), ""
			} else if agent != "" && ag != agent {
				continue
			}
			mu.Lock()
			found = append(found, f)
			mu.Unlock()
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("lease: scan %s: %w", pattern, err)
		}
		return nil
	}
	var err error
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		// SCAN walks one node's keyspace: walk every master's.
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.rdb)
	}
	if err != nil {
		return nil, err
	}
	var out []Info
	for len(found) > 0 {
		n := min(len(found), lookupBatch)
		infos, err := l.lookupListed(ctx, found[:n])
		if err != nil {
			return nil, err
		}
		for _, info := range infos {
			if agent == "" || info.Agent == agent {
				out = append(out, info)
			}
		}
		found = found[n:]
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Agent != b.Agent {
			return a.Agent < b.Agent
		}
		if a.Issue != b.Issue {
			return a.Issue < b.Issue
		}
		return scopeOrder(a.Scope) < scopeOrder(b.Scope)
	})
	return out, nil
}

// listed is a lease record List found: its keys and what its name says.
type listed struct {
	info, lock string
	agent, key string // the agent's own lease: agent and issue; a shared key: its key
	scope      Scope  // "" for an agent's own lease
}

// lookupListed reads the TTL and record of each found lease, in one round trip.
func (l *Locker) lookupListed(ctx context.Context, found []listed) ([]Info, error) {
	pipe := l.rdb.Pipeline()
	ttls := make([]*redis.DurationCmd, len(found))
	recs := make([]*redis.MapStringStringCmd, len(found))
	mails := make([]*redis.IntCmd, len(found))
	lines := make([]lineCmds, len(found))
	for i, f := range found {
		ttls[i] = pipe.PTTL(ctx, f.lock)
		recs[i] = pipe.HGetAll(ctx, f.info)
		// The mailbox's and line's names are the record's with other prefixes (keysFor,
		// Keys.Line); a shared key has a line (wait under scope issue or group), no mailbox.
		if rest, ok := strings.CutPrefix(f.info, "lockinfo:"); ok {
			if f.scope == "" {
				mails[i] = pipe.XLen(ctx, "lockmail:"+rest)
			}
			lines[i] = queueLine(ctx, pipe, "lockline:"+rest)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("lease: look up %d leases: %w", len(found), err)
	}
	out := make([]Info, 0, len(found))
	for i, f := range found {
		ttl := ttls[i].Val()
		if ttl == -2 { // no such key: not held
			continue
		}
		h := recs[i].Val()
		var info Info
		if f.scope == "" {
			info = infoFromHash(f.agent, f.key, h)
		} else {
			info = infoFromHash(h["agent"], h["issue"], h)
			info.Scope, info.Key = f.scope, f.key
		}
		if ttl > 0 {
			info.TTL = ttl
		}
		if mails[i] != nil {
			info.Mailbox = mails[i].Val()
		}
		lines[i].fill(&info)
		out = append(out, info)
	}
	return out, nil
}

func scopeOrder(s Scope) int {
	switch s {
	case ScopeIssue:
		return 1
	case ScopeGroup:
		return 2
	}
	return 0
}

// lineCmds are the queued reads of a key's line: its length and its head.
type lineCmds struct {
	n    *redis.IntCmd
	head *redis.StringSliceCmd
}

func queueLine(ctx context.Context, pipe redis.Pipeliner, line string) lineCmds {
	return lineCmds{n: pipe.ZCard(ctx, line), head: pipe.ZRange(ctx, line, 0, 0)}
}

// fill sets info's Waiting, OldestWaiting and Reserved.
func (c lineCmds) fill(info *Info) {
	info.Reserved = info.Owner == "line"
	if c.n == nil {
		return
	}
	info.Waiting = c.n.Val()
	if h := c.head.Val(); len(h) == 1 {
		if w, err := parseWaiting(h[0]); err == nil {
			info.OldestWaiting = w.JoinedAt
		}
	}
}
