package lease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// The wait policy's line on a shared key (scopes issue and group; scripts/line_scoped.lua):
// an event whose lease holds a shared key waits in that key's line, whichever agent or
// issue holds it, and its turn takes the agent's own key with the shared one. Where
// they share a hash slot (standalone Redis; scope issue on Cluster) one script joins or
// takes, and one releases and hands over; a group key on Cluster is in a slot of its
// own, so the agent's key is taken and released by scripts of its own around the
// shared key's (acquireWaitApart, lineReleaseApart). See docs/architecture.md.

var (
	//go:embed scripts/line_scoped.lua
	lineScopedLua string
	//go:embed scripts/acquire_or_wait_scoped.lua
	acquireOrWaitScopedLua string
	//go:embed scripts/release_line_scoped.lua
	releaseLineScopedLua string
	//go:embed scripts/line_wake_scoped.lua
	lineWakeScopedLua string
	//go:embed scripts/release_line_shared.lua
	releaseLineSharedLua string

	acquireOrWaitScopedScript = newScript(xonce.IndexLua, leaseSteps, lineLua, lineScopedLua, acquireOrWaitScopedLua)
	releaseLineScopedScript   = newScript(xonce.IndexLua, leaseSteps, lineLua, lineScopedLua, releaseLineScopedLua)
	lineWakeScopedScript      = newScript(xonce.IndexLua, leaseSteps, lineLua, lineScopedLua, lineWakeScopedLua)
	releaseLineSharedScript   = newScript(xonce.IndexLua, leaseSteps, lineLua, lineScopedLua, releaseLineSharedLua)
)

// errWaitShared refuses a wait acquire with more than one shared key: the line is on
// the key the event waits on, and one event waits on one key.
var errWaitShared = fmt.Errorf("%w: AcquireOptions.Wait takes at most one shared key (scope issue or group, not both): an event waits in one key's line", ErrBadScope)

// lineArgs are acquire_or_wait_scoped.lua's ARGV up to its event fields.
func (a *acquisition) lineArgs(w *WaitOptions, maxN int64, group, id string, extra ...any) []any {
	args := []any{a.token, a.l.ttlMS, a.owner, a.sentMS, a.mid, lineMember(w), a.l.holdOf(w).Milliseconds(), maxN,
		lineSeenTTL.Milliseconds(), w.Event.Stream, group, id}
	args = append(args, extra...)
	for k, v := range w.Event.Fields {
		args = append(args, k, v)
	}
	return args
}

// acquireWaitScoped is acquireWait for a lease with one shared key: its line is the
// shared key's. It returns the script's reply for finish, or the busy error.
func (l *Locker) acquireWaitScoped(ctx context.Context, a *acquisition, w *WaitOptions, maxN int64) ([]any, error) {
	if len(a.shared) != 1 {
		return nil, errWaitShared
	}
	sk := a.shared[0]
	lk := sk.Line()
	if a.apart {
		return l.acquireWaitApart(ctx, a, w, maxN)
	}
	keys, group, id := l.delivered(w, a.keys.Lock, a.keys.Info, a.keys.Fence, sk.Lock, sk.Info, sk.Fence, lk.Line, lk.Seen, lk.Turn, a.keys.Stop)
	res, err := a.run(ctx, acquireOrWaitScopedScript, keys, a.lineArgs(w, maxN, group, id, a.agent, a.issue, ""))
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %s: %w", sk.Lock, err)
	}
	if len(res) > 0 && atoi(res[0]) != 1 {
		l.opts.Observer.Busy(a.agent)
		return nil, a.lineBusy(res, w)
	}
	return res, nil
}

// acquireWaitApart takes a wait lease whose shared key is in another hash slot (a group
// key on Redis Cluster): the agent's own key first (acquire_scoped.lua with no shared
// key and no superseded check: a waiting event's turn is the line's to give), then the
// shared key's turn or place in its line (acquire_or_wait_scoped.lua, told how the
// first went). The agent's key is given back, unrecorded, unless both are held.
func (l *Locker) acquireWaitApart(ctx context.Context, a *acquisition, w *WaitOptions, maxN int64) ([]any, error) {
	own := []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Done, a.keys.Stop}
	ores, err := acquireScopedScript.Run(ctx, l.rdb, own, a.token, l.ttlMS, a.owner, a.sentMS, a.mid, "", a.agent, a.issue).Slice()
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %s: %w", a.keys.Lock, err)
	}
	held := len(ores) >= 2 && atoi(ores[0]) == 1
	if !held && a.ao.MessageID != "" && sameEntry(holderEntry(ores), a.mid) {
		// The holder's own entry (claimed from its dead worker while its lease lives):
		// neither joined nor acked, it comes back once the key has expired.
		_, err := a.finish(ctx, ores, nil)
		return nil, err
	}
	flag := "0"
	if held {
		flag = "1"
	}
	sk := a.shared[0]
	lk := sk.Line()
	keys, _, id := l.delivered(w, sk.Lock, sk.Info, sk.Fence, lk.Line, lk.Seen, lk.Turn)
	res, err := acquireOrWaitScopedScript.Run(ctx, l.rdb, keys, a.lineArgs(w, maxN, "", id, a.agent, a.issue, flag)...).Slice()
	if err == nil && len(res) >= 3 && atoi(res[0]) == 1 {
		return append([]any{res[0], ores[1], res[2]}, ores[2:]...), nil // ores[2]: granted_stopping's count
	}
	if held {
		a.giveBackOwn(context.WithoutCancel(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %s: %w", sk.Lock, err)
	}
	l.opts.Observer.Busy(a.agent)
	return nil, a.lineBusy(res, w)
}

// lineHolder reads the holder acquire_or_wait_scoped.lua names after the busy reply's
// own fields (agent, lock key, issue), for a lease with a shared key.
func (a *acquisition) lineHolder(res []any, holder *Info, le *LockedError) {
	if len(a.shared) == 0 {
		return
	}
	le.Line = a.ao.Shared[0]
	if len(res) < 13 {
		return
	}
	if atoi(res[6]) == 0 {
		// The holder's own entry (state 0): its own dead run's lease, named as the
		// agent's (the middleware leaves such an entry pending, neither run nor acked).
		return
	}
	holder.Agent, _ = res[10].(string)
	holder.Issue, _ = res[12].(string)
	if lock, _ := res[11].(string); lock == a.shared[0].Lock {
		holder.Scope, holder.Key = a.ao.Shared[0].Scope, a.ao.Shared[0].Key
	}
}

// lineReleaseScoped is lineRelease for a lease whose line is its shared key's.
func (le *Lease) lineReleaseScoped(ctx context.Context, outcome, turn string, e *Entry) (bool, error) {
	if le.apart {
		return le.lineReleaseApart(ctx, outcome, turn)
	}
	ln := le.line
	lk, sk := ln.keys, le.shared[0].Keys
	mode := modeStandalone
	if le.l.opts.Format == KeysCluster {
		mode = modeCluster
	}
	keys := []string{le.keys.Lock, le.keys.Info, le.keys.Done, le.keys.Queue, le.keys.Mailbox, sk.Lock, sk.Info, sk.Fence, lk.Line, lk.Seen, lk.Turn}
	group, id := "", ""
	if e != nil && mode == modeStandalone {
		keys = append(keys, e.Stream)
		group, id = e.Group, e.ID
	}
	pubLid := ""
	released := int64(-1)
	for range maxDrainRounds {
		res, err := releaseLineScopedScript.Run(ctx, le.l.rdb, keys, le.token, outcome, le.entry, mode, le.maxLen, "",
			le.issue, indexMax, indexTTLms, "", ln.lid, turn, ln.hold.Milliseconds(), lineSeenTTL.Milliseconds(),
			pubLid, group, id).Slice()
		if err != nil {
			return false, err
		}
		if len(res) < 2 {
			return false, fmt.Errorf("unexpected reply %v", res)
		}
		if atoi(res[0]) == 5 {
			if released < 0 {
				released = atoi(res[1])
			}
			if pubLid, err = le.l.publishHead(ctx, sk, le.issue, le.maxLen, res[2:]); err != nil {
				return false, err
			}
			continue
		}
		if released < 0 {
			released = atoi(res[0])
		}
		ln.noteMoved(res)
		return released == 1, nil
	}
	return false, fmt.Errorf("lease: release %s: the line kept changing", sk.Lock)
}

// noteMoved keeps the lid a release's reply says it handed the key to.
func (ln *lineLease) noteMoved(res []any) {
	if len(res) >= 4 {
		if next, _ := res[2].(string); next != "" {
			ln.moved.Store(lineEventID(next))
		}
	}
}

// lineReleaseApart ends a wait lease whose shared key is held apart (a group key on
// Redis Cluster): the event's turn is ended first on the shared key (a finished run is
// recorded as ran before anything is given up), then the agent's own key is released
// (release.lua), then the shared key, handed to the head of its line.
func (le *Lease) lineReleaseApart(ctx context.Context, outcome, turn string) (bool, error) {
	ln := le.line
	lk, sk := ln.keys, le.shared[0].Keys
	keys := []string{sk.Lock, sk.Info, sk.Fence, lk.Line, lk.Seen, lk.Turn}
	run := func(phase, pub string) ([]any, error) {
		return releaseLineSharedScript.Run(ctx, le.l.rdb, keys, le.token, ln.lid, turn, ln.hold.Milliseconds(),
			lineSeenTTL.Milliseconds(), modeCluster, pub, le.maxLen, le.issue, indexMax, indexTTLms, phase).Slice()
	}
	if _, err := run("mark", ""); err != nil {
		return false, err
	}
	res, err := le.runRelease(ctx, outcome, "", "").Slice()
	own, err := le.releaseScripted(ctx, outcome, res, err)
	if err != nil {
		return false, err
	}
	pub := ""
	ours := int64(-1)
	for range maxDrainRounds {
		res, err := run("release", pub)
		if err != nil {
			return false, err
		}
		if len(res) < 2 {
			return false, fmt.Errorf("unexpected reply %v", res)
		}
		if atoi(res[0]) == 5 {
			if ours < 0 {
				ours = atoi(res[1])
			}
			if pub, err = le.l.publishHead(ctx, sk, le.issue, le.maxLen, res[2:]); err != nil {
				return false, err
			}
			continue
		}
		if ours < 0 {
			ours = atoi(res[0])
		}
		ln.noteMoved(res)
		return own && ours == 1, nil
	}
	return false, fmt.Errorf("lease: release %s: the line kept changing", sk.Lock)
}

// WakeSharedLine is WakeLine for the line of a shared key sk (scope issue or group;
// Key canonical): it hands the free key to the head of its line when its wake-up was
// lost, and does nothing otherwise. It returns the lid of the event woken, or "".
func (l *Locker) WakeSharedLine(ctx context.Context, sk ScopeKey, maxLen int64, hold time.Duration) (string, error) {
	k := l.SharedKeys(sk)
	issue := ""
	if sk.Scope == ScopeIssue {
		issue = sk.Key
	}
	return l.wakeLineScript(ctx, lineWakeScopedScript, k, issue, maxLen, hold)
}

// SharedLines returns the events waiting for the shared key sk, the head first.
func (l *Locker) SharedLines(ctx context.Context, sk ScopeKey) ([]Waiting, error) {
	return l.linesOf(ctx, l.SharedKeys(sk).Line().Line)
}

// WakeSharedLines is WakeLines for the lines of the shared keys of scope (ScopeIssue
// or ScopeGroup) under this Locker's Options.Scope, whichever agents wait in them.
func (l *Locker) WakeSharedLines(ctx context.Context, scope Scope, hold time.Duration) (LineSweep, error) {
	open, end := "", ""
	if l.opts.Format == KeysCluster {
		open, end = "{", "}"
	}
	prefix := "lockline:" + open + l.opts.Scope + sharedName(scope) + ":"
	keys, err := l.scanLines(ctx, prefix, end)
	var sw LineSweep
	if err != nil {
		return sw, err
	}
	lines := make([]string, 0, len(keys))
	for _, key := range keys {
		sk := ScopeKey{Scope: scope, Key: key}
		lid, err := l.WakeSharedLine(ctx, sk, 0, hold)
		if err != nil {
			return sw, err
		}
		if lid != "" {
			sw.Woken = append(sw.Woken, lid)
		}
		lines = append(lines, l.SharedKeys(sk).Line().Line)
	}
	return sw, l.countLines(ctx, lines, &sw)
}

// scanLines returns what follows prefix (up to end) in the names of the line keys that
// start with it, on every master on Cluster.
func (l *Locker) scanLines(ctx context.Context, prefix, end string) ([]string, error) {
	var mu sync.Mutex
	var out []string
	scan := func(ctx context.Context, c Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if key := strings.TrimSuffix(strings.TrimPrefix(iter.Val(), prefix), end); key != "" {
				mu.Lock()
				out = append(out, key)
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("lease: scan %s*: %w", prefix, err)
	}
	return out, nil
}

// countLines adds the lengths of lines to sw, in one round trip.
func (l *Locker) countLines(ctx context.Context, lines []string, sw *LineSweep) error {
	if len(lines) == 0 {
		return nil
	}
	pipe := l.rdb.Pipeline()
	counts := make([]*redis.IntCmd, len(lines))
	for i, line := range lines {
		counts[i] = pipe.ZCard(ctx, line)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("lease: count %d lines: %w", len(lines), err)
	}
	for _, c := range counts {
		if n := c.Val(); n > 0 {
			sw.Lines++
			sw.Waiting += n
			sw.Longest = max(sw.Longest, n)
		}
	}
	return nil
}
