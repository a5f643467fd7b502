package lease

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// The wait policy's line (scripts/line.lua): an event that finds its key busy joins the
// key's FIFO line and is acked in the same script; the release that frees the key hands
// it to the head of the line in its own script and appends the head's copy to its
// stream; the copy's acquire takes the key reserved for it. See docs/architecture.md.

var (
	//go:embed scripts/line.lua
	lineLua string
	//go:embed scripts/acquire_or_wait.lua
	acquireOrWaitLua string
	//go:embed scripts/release_line.lua
	releaseLineLua string
	//go:embed scripts/line_wake.lua
	lineWakeLua string

	acquireOrWaitScript = newScript(xonce.IndexLua, leaseSteps, lineLua, acquireOrWaitLua)
	releaseLineScript   = newScript(xonce.IndexLua, leaseSteps, lineLua, releaseLineLua)
	lineWakeScript      = newScript(xonce.IndexLua, leaseSteps, lineLua, lineWakeLua)
)

// ErrLineFull is wrapped by *LineFullError: WaitOptions.Max events wait for the key
// already; the event was not put in the line (nor acked).
var ErrLineFull = errors.New("lease: the key's line is full")

// LineFullError names the lease whose line refused an event.
type LineFullError struct {
	Holder  Info
	Waiting int64
}

func (e *LineFullError) Error() string {
	return fmt.Sprintf("%v: %d events wait for %s:%s already", ErrLineFull, e.Waiting, e.Holder.Agent, e.Holder.Issue)
}

func (e *LineFullError) Unwrap() error { return ErrLineFull }

// DefaultLineMax is WaitOptions.Max's default.
const DefaultLineMax = 100

// lineSeenTTL is how long a line, and the record of which events joined and ran, live
// after their last write: long after any redelivery of a copy.
const lineSeenTTL = 7 * 24 * time.Hour

// WaitOptions select the wait policy (AcquireOptions.Wait).
type WaitOptions struct {
	// Event is the event itself: its copy is appended to Event.Stream when its turn
	// comes. It must carry LineID (the caller's waited_from metadata), so that the
	// copy's acquire names the same member of the line. Required.
	Event QueuedEvent
	// LineID names the event in the line: the id of the stream entry it first had (its
	// copies keep it). Required.
	LineID string
	// Max bounds the line: an event that finds Max waiting is refused with a
	// *LineFullError. Default: DefaultLineMax.
	Max int64
	// Hold is how long a turn outlives its run's last heartbeat: a run that did not
	// finish (a crash, a failure) keeps the key for its redelivery that long, and a key
	// handed to the head waits that long for the head's copy. It must exceed the
	// redelivery delay (the claim threshold, with room for a crash of the claimer).
	// Default: 2×TTL.
	Hold time.Duration
	// Ack is the event's stream entry: the line remembers it when it takes the event (a
	// join, a repeat, a copy: the caller acks it then, after its record), so that no
	// later delivery of it takes the key (a stale copy); on standalone Redis the script
	// that ends its run acks it. Default: nil.
	Ack *Entry
	// Match, when set with Ack, says whether a stream entry (its fields) is an event of
	// the same key under the wait policy, and its lid ("" for the entry's own id). A
	// release (and WakeLineBefore) then looks, before handing the key to the line's
	// head, for entries of the key earlier than the head that were delivered but have
	// not joined the line (a worker's read-ahead, a dead consumer's pending entry):
	// delivery is in stream order, so each is pending in Ack's group. While one is,
	// the key is left free for it (its acquire takes it: it is earlier than the head).
	// Default: nil (no look: the head is handed the key).
	Match func(fields map[string]any) (lid string, ok bool)
}

// PendingScan names where a hand-over looks for entries of its key delivered but not
// in the line (WaitOptions.Match): the stream and group, the entry to leave out (the
// releasing event's own), and Match.
type PendingScan struct {
	Stream, Group, Exclude string
	Match                  func(fields map[string]any) (lid string, ok bool)
}

// pendingScanMax bounds the pending entries a hand-over reads; pendingArgsMax bounds
// the lids it passes to the script. A scan that hits its bound passes pendingMaybe
// (earlier than any head, in no line): the key is left free, as if an earlier entry
// were pending; the entry's own acquire, or the line waker, moves the line on.
const (
	pendingScanMax = 200
	pendingArgsMax = 16
	pendingMaybe   = "0-1"
)

// earlierPending returns the lids of the entries s finds pending in its group that are
// events of line's key earlier in the stream than the line's head (bounded), for
// release_line.lua and line_wake.lua (line_blocked). Nil when there is no line. On
// Redis Cluster the stream is in another slot than the line: this runs before the
// script, which is safe because an entry delivered before the head only leaves the
// pending list by joining the line or ending, never comes back into it.
func (l *Locker) earlierPending(ctx context.Context, line string, s *PendingScan) ([]any, error) {
	if s == nil || s.Match == nil || s.Stream == "" {
		return nil, nil
	}
	pre := l.rdb.Pipeline()
	headCmd := pre.ZRange(ctx, line, 0, 0)
	pendCmd := pre.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.Stream, Group: s.Group, Start: "-", End: "+", Count: pendingScanMax})
	_, _ = pre.Exec(ctx)
	head, err := headCmd.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("lease: read %s: %w", line, err)
	}
	if len(head) == 0 {
		return nil, nil
	}
	w, err := parseWaiting(head[0])
	if err != nil {
		return nil, err
	}
	pend, err := pendCmd.Result()
	if err != nil {
		return nil, fmt.Errorf("lease: pending entries of %s: %w", s.Stream, err)
	}
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, 0, len(pend))
	for _, p := range pend {
		if p.ID != s.Exclude {
			cmds = append(cmds, pipe.XRange(ctx, s.Stream, p.ID, p.ID))
		}
	}
	if len(cmds) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("lease: read pending entries of %s: %w", s.Stream, err)
		}
	}
	var out []any
	for _, c := range cmds {
		for _, msg := range c.Val() {
			lid, ok := s.Match(msg.Values)
			if lid == "" {
				lid = msg.ID
			}
			if ok && streamid.Compare(lid, w.LineID) < 0 && len(out) < pendingArgsMax {
				out = append(out, member(lid, s.Stream)) // as the line names it
			}
		}
	}
	if len(pend) >= pendingScanMax {
		out = append(out, pendingMaybe)
	}
	return out, nil
}

// member names an event in a line or a limit's lines: its lid (the stream entry it
// first had) and that stream. A line holds the events of several streams (an agent's
// key's: its stream's and its :todo stream's; a shared key's: several agents'), and so
// do a limit's lines, whose entry ids repeat: two events that entered two streams with
// one id are two members, not one event and its repeat (which is acked and never run).
// The line scripts order by the id part.
func member(lid, stream string) string { return lid + " " + stream }

// lineMember is the member of a line that w's event is.
func lineMember(w *WaitOptions) string { return member(w.LineID, w.Event.Stream) }

// entryName is how the scripts name an event's entry (message_id): its id and its
// stream, or its id alone when the stream is not known (lease.lua's entry_id, and the
// record keeps them apart).
func entryName(id, stream string) string {
	if id == "" || stream == "" {
		return id
	}
	return member(id, stream)
}

// sameEntry reports whether a and b name one entry (entryName): by id and stream, or by
// id alone when either does not name its stream (lease.lua's same_entry).
func sameEntry(a, b string) bool {
	if a == b {
		return true
	}
	ia, _, qa := strings.Cut(a, " ")
	ib, _, qb := strings.Cut(b, " ")
	return (!qa || !qb) && ia == ib
}

// lineEventID is the lid of a member (member without its stream).
func lineEventID(m string) string {
	id, _, _ := strings.Cut(m, " ")
	return id
}

// LineKeys are the Redis keys of a lease's line, in its hash slot.
type LineKeys struct {
	Line string // sorted set: the waiting events, in stream order
	Seen string // hash: lid -> w (waiting), h (its turn), r (ran)
	Turn string // string: the lid whose turn it is
}

// Line returns the keys of the lease's line (policy wait).
func (k Keys) Line() LineKeys {
	rest := strings.TrimPrefix(k.Lock, "lock:")
	return LineKeys{Line: "lockline:" + rest, Seen: "lockseen:" + rest, Turn: "lockturn:" + rest}
}

// lineLease is a wait policy lease's part: its event's lid and its line's settings.
type lineLease struct {
	lid   string
	hold  time.Duration
	keys  LineKeys
	ack   *Entry
	moved atomic.Value // string: the lid its release handed the key to
	// scan: where its release looks for earlier events of the key not in the line yet
	// (WaitOptions.Match), or nil.
	scan *PendingScan
	// shared: the line is the lease's shared key's (scope issue or group), not its
	// agent key's (line_scoped.go).
	shared bool
}

// holdOf is WaitOptions.Hold or its default.
func (l *Locker) holdOf(w *WaitOptions) time.Duration {
	if w.Hold > 0 {
		return max(w.Hold, l.opts.TTL)
	}
	return 2 * l.opts.TTL
}

// acquireWait is Acquire under the wait policy: acquire_or_wait.lua.
func (l *Locker) acquireWait(ctx context.Context, a *acquisition) (*Lease, error) {
	w := a.ao.Wait
	if w.LineID == "" || w.Event.Stream == "" {
		return nil, errors.New("lease: AcquireOptions.Wait needs LineID and Event.Stream")
	}
	if a.ao.Queue != nil || a.ao.Deliver != nil || a.ao.Supersede {
		return nil, errors.New("lease: AcquireOptions.Wait cannot be combined with Queue, Deliver or Supersede")
	}
	lk := a.keys.Line()
	maxN := w.Max
	if maxN <= 0 {
		maxN = DefaultLineMax
	}
	hold := l.holdOf(w)
	if len(a.shared) > 0 {
		// The line is the shared key's: the key the event waits on (line_scoped.go).
		res, err := l.acquireWaitScoped(ctx, a, w, maxN)
		if err != nil {
			return nil, err
		}
		return l.finishWait(ctx, a, res, &lineLease{lid: lineMember(w), hold: hold, keys: a.shared[0].Line(), ack: w.Ack, shared: true})
	}
	keys, group, id := l.delivered(w, a.keys.Lock, a.keys.Info, a.keys.Fence, lk.Line, lk.Seen, lk.Turn, a.keys.Stop)
	args := []any{a.token, l.ttlMS, a.owner, a.sentMS, a.mid, lineMember(w), hold.Milliseconds(), maxN,
		lineSeenTTL.Milliseconds(), w.Event.Stream, group, id}
	for k, v := range w.Event.Fields {
		args = append(args, k, v)
	}
	res, err := a.run(ctx, acquireOrWaitScript, keys, args)
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %s: %w", a.keys.Lock, err)
	}
	if len(res) > 0 && atoi(res[0]) != 1 {
		l.opts.Observer.Busy(a.agent)
		return nil, a.lineBusy(res, w)
	}
	return l.finishWait(ctx, a, res, &lineLease{lid: lineMember(w), hold: hold, keys: lk, ack: w.Ack, scan: scanOf(w)})
}

// delivered completes a wait acquire's KEYS with the source stream (standalone Redis:
// the script asks whether the delivered entry was acked, line_entry_acked) and returns
// the group and the delivered entry's id for its ARGV. The entry id goes on Redis
// Cluster too: the line remembers the entries it took, and refuses a later delivery of
// one of them (line_stale).
func (l *Locker) delivered(w *WaitOptions, keys ...string) (_ []string, group, id string) {
	if w.Ack == nil {
		return keys, "", ""
	}
	if l.opts.Format == KeysCluster {
		return keys, "", w.Ack.ID
	}
	return append(keys, w.Ack.Stream), w.Ack.Group, w.Ack.ID
}

// scanOf is the pending scan of w (WaitOptions.Match), or nil.
func scanOf(w *WaitOptions) *PendingScan {
	if w.Match == nil || w.Ack == nil {
		return nil
	}
	return &PendingScan{Stream: w.Ack.Stream, Group: w.Ack.Group, Exclude: w.Ack.ID, Match: w.Match}
}

// finishWait turns a wait acquire's {1, ...} reply into its lease, whose heartbeat
// keeps its turn alive too.
func (l *Locker) finishWait(ctx context.Context, a *acquisition, res []any, ln *lineLease) (*Lease, error) {
	le, err := a.finish(ctx, res, nil)
	if err != nil {
		return nil, err
	}
	le.line = ln
	onBeat, turn, hold := le.onBeat, ln.keys.Turn, ln.hold
	le.onBeat = func(ctx context.Context, pipe redis.Pipeliner) {
		if onBeat != nil {
			onBeat(ctx, pipe)
		}
		// The turn outlives the run's last heartbeat by Hold: its redelivery after a
		// crash finds the key its own.
		pipe.PExpire(ctx, turn, hold)
	}
	if err := le.replicated(ctx); err != nil {
		return nil, err
	}
	return le, nil
}

// lineBusy turns acquire_or_wait's busy reply into a *LockedError (Waited, with the
// event's place in the line) or a *LineFullError.
func (a *acquisition) lineBusy(res []any, w *WaitOptions) error {
	holder := Info{Agent: a.agent, Issue: a.issue, Scope: ScopeAgent, Key: a.issue}
	full := atoi(res[0]) == 3
	if full && len(res) >= 7 {
		res = res[1:] // depth first, then the holder
	}
	holderFields(res, &holder)
	if full {
		return &LineFullError{Holder: holder, Waiting: atoi(res[0])}
	}
	le := &LockedError{Holder: holder, Issue: a.issue}
	a.lineHolder(res, &le.Holder, le)
	if len(res) < 10 {
		return le
	}
	st := atoi(res[6])
	le.Own = st == 0 // the holder's own entry: the script says so, whatever the holder's record names
	le.Waited = st == 1 || st == 2
	le.Duplicate = st == 2 || st == 4
	le.Ran = st == 3
	le.Position = atoi(res[7])
	if ms := atoi(res[8]); ms > 0 {
		le.OldestAt = time.UnixMilli(ms)
	}
	le.Stranded = atoi(res[9]) == 1
	return le
}

// How a wait lease's release ends its event's turn (release_line.lua's done).
const (
	turnKeep = "0" // no run happened (a give-back): the event keeps its turn
	turnRan  = "1" // the run finished: it ran, its turn ends
	turnPass = "2" // the run failed: its turn ends; its retry joins the line again
)

// lineRelease ends a wait lease: release_line.lua, and on Redis Cluster its rounds (a
// coalesced follow-up or the line's head to append first, each once by its id). turn
// says how the event's turn ends (turnRan: e is acked here on standalone Redis). It
// reports whether the lease was deleted.
func (le *Lease) lineRelease(ctx context.Context, outcome, turn string, e *Entry) (bool, error) {
	ln := le.line
	if ln.shared {
		return le.lineReleaseScoped(ctx, outcome, turn, e)
	}
	lk := ln.keys
	mode := modeStandalone
	if le.l.opts.Format == KeysCluster {
		mode = modeCluster
	}
	keys := []string{le.keys.Lock, le.keys.Info, le.keys.Done, le.keys.Queue, le.keys.Mailbox, le.keys.Fence, lk.Line, lk.Seen, lk.Turn}
	group, id := "", ""
	if e != nil && mode == modeStandalone {
		keys = append(keys, e.Stream)
		group, id = e.Group, e.ID
	}
	pubQid, pubLid, pubMS := "", "", ""
	// Earlier events of the key delivered but not in the line: the key is not handed
	// over past them (line_blocked).
	earlier, err := le.l.earlierPending(ctx, lk.Line, ln.scan)
	if err != nil {
		return false, err
	}
	released := int64(-1)
	for range maxDrainRounds {
		args := append([]any{le.token, outcome, le.entry, mode, le.maxLen, pubQid,
			le.issue, indexMax, indexTTLms, pubMS, ln.lid, turn, ln.hold.Milliseconds(), lineSeenTTL.Milliseconds(),
			pubLid, group, id}, earlier...)
		res, err := releaseLineScript.Run(ctx, le.l.rdb, keys, args...).Slice()
		if err != nil {
			return false, err
		}
		if len(res) < 2 {
			return false, fmt.Errorf("unexpected reply %v", res)
		}
		switch atoi(res[0]) {
		case 3:
			if pubQid, err = le.publishQueued(ctx, res[1:]); err != nil {
				return false, err
			}
			pubMS, _, _ = strings.Cut(le.Requeued(), "-")
			continue
		case 5:
			if released < 0 {
				released = atoi(res[1])
			}
			if pubLid, err = le.l.publishHead(ctx, le.keys, le.issue, le.maxLen, res[2:]); err != nil {
				return false, err
			}
			continue
		}
		if released < 0 {
			released = atoi(res[0])
		}
		if len(res) >= 4 {
			if qid, _ := res[1].(string); qid != "" {
				le.requeued.Store(qid)
			}
			if next, _ := res[2].(string); next != "" {
				ln.moved.Store(lineEventID(next)) // the promoted lid (res[3] is its copy's new id)
			}
		}
		return released == 1, nil
	}
	return false, fmt.Errorf("lease: release %s: the line kept changing", le.keys.Lock)
}

// publishHead appends the line's head (lid@joined_ms, field, value, ...) to its stream,
// once per joining (Redis Cluster: the stream is in another slot), and returns its
// lid@joined_ms.
func (l *Locker) publishHead(ctx context.Context, keys Keys, issue string, maxLen int64, h []any) (string, error) {
	if len(h) < 1 {
		return "", fmt.Errorf("lease: line head reply %v", h)
	}
	lid := fmt.Sprint(h[0])
	values := map[string]any{}
	stream := ""
	for i := 1; i+1 < len(h); i += 2 {
		if k := fmt.Sprint(h[i]); k == "_stream" {
			stream = fmt.Sprint(h[i+1])
		} else if k == "_issue" {
			// A shared key's line: the head's own issue (line_scoped.lua).
			if v := fmt.Sprint(h[i+1]); v != "" {
				issue = v
			}
		} else {
			values[k] = h[i+1]
		}
	}
	if _, err := xonce.Run(ctx, l.rdb, xonce.Append{Stream: stream, ID: "line-" + keys.Lock + "-" + lid,
		Issue: issue, Values: values, MaxLen: maxLen, TTL: l.opts.MaxHold + l.opts.TTL}); err != nil {
		return "", fmt.Errorf("lease: publish the head of %s's line to %s: %w", keys.Lock, stream, err)
	}
	return lid, nil
}

// WakeLine hands the free key (agent, issue) to the head of its line when the line's
// wake-up was lost (nobody holds the key, it is nobody's turn, events wait:
// LockedError.Stranded) and does nothing otherwise: safe from any worker at any time. It
// returns the lid of the event woken, or "".
func (l *Locker) WakeLine(ctx context.Context, agent, issue string, maxLen int64, hold time.Duration) (string, error) {
	return l.WakeLineBefore(ctx, agent, issue, maxLen, hold, nil)
}

// WakeLineBefore is WakeLine that first looks, as a release does, for events of the key
// earlier than the line's head delivered but not in the line (scan, or nil: no look):
// while one is pending, the key is left free for it.
func (l *Locker) WakeLineBefore(ctx context.Context, agent, issue string, maxLen int64, hold time.Duration, scan *PendingScan) (string, error) {
	k := l.Keys(agent, issue)
	earlier, err := l.earlierPending(ctx, k.Line().Line, scan)
	if err != nil {
		return "", err
	}
	return l.wakeLineScript(ctx, lineWakeScript, k, issue, maxLen, hold, earlier...)
}

// wakeLineScript runs a line wake script (line_wake.lua or line_wake_scoped.lua) on the
// line of key k, publishing its head on Cluster.
func (l *Locker) wakeLineScript(ctx context.Context, s script, k Keys, issue string, maxLen int64, hold time.Duration, earlier ...any) (string, error) {
	lk := k.Line()
	mode := modeStandalone
	if l.opts.Format == KeysCluster {
		mode = modeCluster
	}
	hold = l.holdOf(&WaitOptions{Hold: hold})
	keys := []string{k.Lock, k.Info, k.Fence, lk.Line, lk.Seen, lk.Turn}
	pub := ""
	for range maxDrainRounds {
		args := append([]any{mode, pub, hold.Milliseconds(), lineSeenTTL.Milliseconds(),
			maxLen, issue, indexMax, indexTTLms}, earlier...)
		res, err := s.Run(ctx, l.rdb, keys, args...).Slice()
		if err != nil {
			return "", fmt.Errorf("lease: wake %s: %w", lk.Line, err)
		}
		if len(res) >= 3 && atoi(res[0]) == 5 {
			if pub, err = l.publishHead(ctx, k, issue, maxLen, res[2:]); err != nil {
				return "", err
			}
			continue
		}
		if len(res) >= 3 {
			lid, _ := res[2].(string)
			return lineEventID(lid), nil
		}
		return "", fmt.Errorf("lease: wake %s: unexpected reply %v", lk.Line, res)
	}
	return "", fmt.Errorf("lease: wake %s: the line kept changing", lk.Line)
}

// Waits reports whether the lease was taken under the wait policy (AcquireOptions.Wait).
func (le *Lease) Waits() bool { return le.line != nil }

// Woke is the line id of the event this lease's release handed the key to (policy
// wait), or "".
func (le *Lease) Woke() string {
	if le.line == nil {
		return ""
	}
	s, _ := le.line.moved.Load().(string)
	return s
}

// ReleaseLost ends a lease that ended under its run (lost, unproven, MaxHold), for
// lockmw's finishLost: as Release, but a wait lease's event keeps its turn, as a
// crashed run's does. Its entry, handed over again, takes the key back under its own
// id, where the worker kept the agent's result: passed on, the turn would send the
// event to the back of the line, to come back as a new copy that runs the agent again
// (and after events later in the stream). The line moves on when the turn expires.
func (le *Lease) ReleaseLost(ctx context.Context) (bool, error) {
	if le.line == nil {
		return le.Release(ctx)
	}
	return le.endLine(ctx, nil, outcomeRan, lostTurn, nil)
}

// lostTurn is how ReleaseLost ends the event's turn: kept (a variable for the model
// checker's planted defect, TestModelLeaseLinePlantedLapsePassesTurn).
var lostTurn = turnKeep

// releaseLineLease is release for a wait lease whose event is not done: a failed run
// passes its turn on (its retry joins the line again), a give-back keeps it.
func (le *Lease) releaseLineLease(ctx context.Context, then func(pipe redis.Pipeliner), outcome string) (bool, error) {
	turn := turnPass
	if outcome == outcomeGivenBack {
		turn = turnKeep
	}
	return le.endLine(ctx, then, outcome, turn, nil)
}

// endLine stops the heartbeat and runs lineRelease, then then's commands.
func (le *Lease) endLine(ctx context.Context, then func(pipe redis.Pipeliner), outcome, turn string, e *Entry) (bool, error) {
	first := le.beginRelease()
	deleted, err := le.lineRelease(ctx, outcome, turn, e)
	// The line's release scripts do not free the run's slots: freed right after.
	le.freeSlotsApart(ctx)
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err != nil {
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).
			Msg("lease release failed; the key will expire by its TTL")
		return false, fmt.Errorf("lease: release %s: %w", le.keys.Lock, err)
	}
	if e != nil && le.l.opts.Format == KeysCluster {
		then = ack(ctx, *e)
	}
	return deleted, le.afterRelease(ctx, then)
}

// finishLine ends a wait lease whose event is done: release, record that it ran (a
// redelivered copy is then acked, not run again), end its turn, hand the key to the
// head of the line, and ack e, in one script on standalone Redis (the ack after it on
// Cluster). Handoff calls it for a wait lease.
func (le *Lease) finishLine(ctx context.Context, e Entry) error {
	_, err := le.endLine(ctx, nil, outcomeRan, turnRan, &e)
	return err
}

// Waiting is one event in a key's line (Locker.Lines).
type Waiting struct {
	LineID   string    // the id of the stream entry it first had
	Stream   string    // where its copy goes when its turn comes
	JoinedAt time.Time // server time
}

// Lines returns the events waiting for (agent, issue), the head first.
func (l *Locker) Lines(ctx context.Context, agent, issue string) ([]Waiting, error) {
	return l.linesOf(ctx, l.Keys(agent, issue).Line().Line)
}

// linesOf reads the line at key line, the head first.
func (l *Locker) linesOf(ctx context.Context, line string) ([]Waiting, error) {
	pipe := l.rdb.Pipeline()
	cmd := pipe.ZRange(ctx, line, 0, -1)
	_, _ = pipe.Exec(ctx)
	raw, err := cmd.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("lease: read %s: %w", line, err)
	}
	out := make([]Waiting, 0, len(raw))
	for _, r := range raw {
		w, err := parseWaiting(r)
		if err != nil {
			return nil, fmt.Errorf("lease: %s: %w", line, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// parseWaiting reads one member of a line: its sequence, 12 digits, a space, then
// {lid, joined_ms, '_stream', stream, ...} (scripts/line.lua).
func parseWaiting(s string) (Waiting, error) {
	if len(s) < 13 {
		return Waiting{}, fmt.Errorf("bad line member %q", s)
	}
	s = s[13:]
	var e []any
	if err := json.Unmarshal([]byte(s), &e); err != nil || len(e) < 4 {
		return Waiting{}, fmt.Errorf("bad line element %q", s)
	}
	w := Waiting{LineID: lineEventID(fmt.Sprint(e[0])), Stream: fmt.Sprint(e[3])}
	if ms, ok := e[1].(float64); ok {
		w.JoinedAt = time.UnixMilli(int64(ms))
	}
	return w, nil
}

// LineSweep is what WakeLines found: the lids it woke, and the lines of the agent (how
// many, how many events wait in them, the longest's length).
type LineSweep struct {
	Woken            []string
	Lines            int
	Waiting, Longest int64
}

// WakeLines wakes every stranded line of agent (WakeLine on each key that has a line):
// the sweep that moves a line whose turn expired while no further event came for its
// key. It finds the lines by SCAN (every master's on Cluster).
func (l *Locker) WakeLines(ctx context.Context, agent string, hold time.Duration) (LineSweep, error) {
	return l.WakeLinesBefore(ctx, agent, hold, nil)
}

// WakeLinesBefore is WakeLines whose wakes look first, as a release does, for events of
// each key delivered but not in its line (WakeLineBefore with scan(issue); scan nil, or
// its nil result: no look).
func (l *Locker) WakeLinesBefore(ctx context.Context, agent string, hold time.Duration, scan func(issue string) *PendingScan) (LineSweep, error) {
	open, end := "", ""
	if l.opts.Format == KeysCluster {
		open, end = "{", "}"
	}
	found, err := l.scanLines(ctx, "lockline:"+open+l.opts.Scope+agent+":", end)
	var sw LineSweep
	if err != nil {
		return sw, err
	}
	lines := make([]string, 0, len(found))
	for _, issue := range found {
		if _, err := l.Canonicalize(issue); err != nil {
			continue
		}
		var ps *PendingScan
		if scan != nil {
			ps = scan(issue)
		}
		lid, err := l.WakeLineBefore(ctx, agent, issue, 0, hold, ps)
		if err != nil {
			return sw, err
		}
		if lid != "" {
			sw.Woken = append(sw.Woken, lid)
		}
		lines = append(lines, l.Keys(agent, issue).Line().Line)
	}
	return sw, l.countLines(ctx, lines, &sw)
}
