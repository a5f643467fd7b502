package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Lease is a held per-issue lease. Its methods are safe for concurrent use.
type Lease struct {
	l          *Locker
	agent      string
	issue      string
	keys       Keys
	token      string
	messageID  string
	entry      string // the release scripts' message id: messageID with its stream (entryName)
	fence      int64
	acquiredAt time.Time
	onBeat     func(context.Context, redis.Pipeliner)
	drain      bool
	maxLen     int64
	requeued   atomic.Value  // string: id of the drained follow-up
	appends    atomic.Int64  // fenced appends so far: each one's id for xonce
	shared     []SharedLease // the shared keys held with it (scopes issue, group)
	apart      bool          // shared is in another hash slot (Locker.apart): scripts of its own
	// ending: the lease has ended, lost or released (endOnce: one end is logged and
	// counted, whoever comes first).
	ending atomic.Bool
	// The runs superseded on the key that this lease's acquire found still stopping
	// (to wait for, WaitStopped; every acquire script reports them: -1 only for a reply
	// without them, and WaitStopped then asks) and the message whose run it took over
	// (Supersede policy), if any.
	stopping   int64
	supersedes string
	// line is the wait policy's part (line.go); nil for any other lease.
	line *lineLease
	// slots are the run's concurrency-limit slots, taken, renewed and freed in the
	// lease's own scripts (slots_lease.go); nil without.
	slots *leaseSlots

	ctx    context.Context
	cancel context.CancelCauseFunc
	unbind func() bool // unties the lease from the context it was acquired under or bound to (Unbind)

	// The heartbeat starts lazily: a lease released before its first extend is due
	// (most events take milliseconds) costs a place in its Locker's starter list, no
	// goroutine and no timer of its own.
	hbMu      sync.Mutex
	hbStopped bool          // Release began: the heartbeat must not start or go on
	stop      chan struct{} // closed by Release once the heartbeat runs
	done      chan struct{} // closed when the running heartbeat has ended

	// In the starter's list (guarded by its mutex) until the heartbeat starts at hbDue.
	hbDue          time.Time
	hbPrev, hbNext *Lease
	hbQueued       bool
}

// log is the lease's logger, built only when something is logged.
func (le *Lease) log() *zerolog.Logger {
	l := le.l.opts.Logger.With().Str("agent", le.agent).Str("issue_key", le.issue).
		Int64("fence", le.fence).Str("token", le.token[:8]).Logger()
	return &l
}

// startHeartbeatLater arranges for the heartbeat to start when the first extend is due
// (or MaxHold passes, if sooner).
func (le *Lease) startHeartbeatLater() {
	now := time.Now()
	le.hbDue = now.Add(min(le.l.opts.TTL/3, le.acquiredAt.Add(le.l.opts.MaxHold).Sub(now)))
	le.l.starter.add(le)
}

// startHeartbeat runs the heartbeat, unless the lease is being released. The first
// extend proves the lease from its acquire on.
func (le *Lease) startHeartbeat() {
	le.hbMu.Lock()
	if le.hbStopped {
		le.hbMu.Unlock()
		return
	}
	le.stop, le.done = make(chan struct{}), make(chan struct{})
	le.hbMu.Unlock()
	le.heartbeat(le.acquiredAt)
}

// stopHeartbeat stops the heartbeat, or keeps it from starting, and waits until it has
// ended. It is idempotent.
func (le *Lease) stopHeartbeat() {
	le.hbMu.Lock()
	first := !le.hbStopped
	le.hbStopped = true
	if first {
		le.l.starter.remove(le)
		le.l.evict.untrack(le)
		if le.stop != nil {
			close(le.stop)
		}
	}
	done := le.done
	le.hbMu.Unlock()
	if first && le.unbind != nil {
		le.unbind()
	}
	if done != nil {
		<-done
	}
}

// Context is cancelled when the lease ends; context.Cause tells why (ErrLeaseLost,
// ErrLeaseUnproven, ErrMaxHold, ErrReleased, or the cause of the end of the context it
// was acquired under, unless Unbind untied it first). It carries that context's values,
// not its deadline (a lease taken ahead, Pending.Take, never had one): the deadline's
// passing ends the lease with context.DeadlineExceeded as its cause.
func (le *Lease) Context() context.Context { return le.ctx }

// Fence is this acquisition's fence: greater than every earlier one for the same key.
func (le *Lease) Fence() int64 { return le.fence }

// Agent is the agent (stage) the lease is held for.
func (le *Lease) Agent() string { return le.agent }

// Issue is the canonical issue key of the lease.
func (le *Lease) Issue() string { return le.issue }

// Token is the random value held in the lock key: proof of ownership, for checks made
// outside this package (tests, operators comparing with Redis).
func (le *Lease) Token() string { return le.token }

// Keys are the Redis keys of the lease.
func (le *Lease) Keys() Keys { return le.keys }

// SharedLease is one shared key held with a lease (AcquireOptions.Shared): its scope
// and key, its Redis keys (Lock, Info, Fence) and the fence this acquisition took on it,
// greater than every earlier holder's of that key, whatever their agent.
type SharedLease struct {
	ScopeKey
	Keys  Keys
	Fence int64
}

// Shared are the shared keys held with the lease, in the fixed order (issue, group);
// none for a lease of scope agent alone.
func (le *Lease) Shared() []SharedLease { return le.shared }

// lockInfoKeys are the lock and info keys of the lease then of the shared keys in its
// hash slot, in pairs: what extend.lua extends and release.lua's release_shared
// deletes in the lease's own scripts.
func (le *Lease) lockInfoKeys() []string {
	keys := make([]string, 0, 2+2*len(le.shared))
	keys = append(keys, le.keys.Lock, le.keys.Info)
	if !le.apart {
		keys = appendLockInfo(keys, le.shared)
	}
	return keys
}

// extendKeys are extend.lua's KEYS for the lease's own hash slot: lockInfoKeys, then
// the holders keys of its slots (standalone Redis), whose number is its third ARGV.
func (le *Lease) extendKeys() ([]string, int) {
	keys := le.lockInfoKeys()
	if le.slots == nil {
		return keys, 0
	}
	h := le.slots.holders()
	return append(keys, h...), len(h)
}

// apartKeys are the lock and info keys of the shared keys held in another hash slot
// (Locker.apart), in pairs, for scripts of their own; nil when there are none.
func (le *Lease) apartKeys() []string {
	if !le.apart {
		return nil
	}
	return appendLockInfo(make([]string, 0, 2*len(le.shared)), le.shared)
}

func appendLockInfo(keys []string, shared []SharedLease) []string {
	for _, s := range shared {
		keys = append(keys, s.Keys.Lock, s.Keys.Info)
	}
	return keys
}

// AcquiredAt is when the acquire was sent (the lease's MaxHold counts from it).
func (le *Lease) AcquiredAt() time.Time { return le.acquiredAt }

// Locker is the locker that granted the lease, e.g. to look at the same issue's
// leases of other agents.
func (le *Lease) Locker() *Locker { return le.l }

// Held reports whether the lease is still held: no loss or release of it has begun.
// It turns false before the lease's context is cancelled (and before the Observer
// hears of a loss), so a caller that learnt of the loss elsewhere finds it ended.
func (le *Lease) Held() bool { return !le.ending.Load() && le.ctx.Err() == nil }

// Err is nil while the lease is held, else the cause of its end.
func (le *Lease) Err() error {
	if le.ctx.Err() == nil {
		return nil
	}
	return context.Cause(le.ctx)
}

func (le *Lease) heartbeat(lastOK time.Time) {
	defer close(le.done)
	ttl := le.l.opts.TTL
	interval := ttl / 3
	proven := func(sent time.Time) time.Duration { return time.Until(sent.Add(ttl - le.l.opts.SafetyMargin)) }

	unproven := time.NewTimer(proven(lastOK))
	defer unproven.Stop()
	maxHold := time.NewTimer(time.Until(le.acquiredAt.Add(le.l.opts.MaxHold)))
	defer maxHold.Stop()
	beat := time.NewTimer(time.Until(le.acquiredAt.Add(interval)))
	defer beat.Stop()
	retry := min(interval, 100*time.Millisecond)

	for {
		select {
		case <-le.stop:
			return
		case <-maxHold.C:
			le.end(fmt.Errorf("%w (%s)", ErrMaxHold, le.l.opts.MaxHold))
			return
		case <-unproven.C:
			le.end(fmt.Errorf("%w: no extend succeeded since %s (TTL %s)", ErrLeaseUnproven,
				lastOK.Format(time.RFC3339Nano), ttl))
			return
		case <-beat.C:
		}
		sent := time.Now()
		// An extend that answers after the lease could have expired proves nothing. The
		// client may not honour the deadline while it dials or reads (go-redis without
		// ContextTimeoutEnabled), so the extend runs aside and the deadlines keep
		// ticking here.
		ctx, cancel := context.WithTimeout(context.Background(), max(proven(lastOK), time.Millisecond))
		type reply struct {
			ok  bool
			err error
		}
		replied := make(chan reply, 1)
		go func() {
			ok, err := le.extend(ctx)
			replied <- reply{ok, err}
		}()
		var r reply
		select {
		case r = <-replied:
			cancel()
		case <-le.stop:
			cancel()
			return
		case <-maxHold.C:
			cancel()
			le.end(fmt.Errorf("%w (%s)", ErrMaxHold, le.l.opts.MaxHold))
			return
		case <-unproven.C:
			cancel()
			le.end(fmt.Errorf("%w: no extend succeeded since %s (TTL %s)", ErrLeaseUnproven,
				lastOK.Format(time.RFC3339Nano), ttl))
			return
		}
		ok, err := r.ok, r.err
		switch {
		case err != nil:
			// The back-off never waits past half the time the lease has left: as the
			// proof runs out the tries come closer together, so a Redis that comes back
			// just before the deadline is met by an extend, not by the lease's end.
			wait := min(retry, max(proven(lastOK)/2, 10*time.Millisecond))
			le.log().Warn().Err(err).Dur("retry_in", wait).Msg("lease extend failed; retrying")
			beat.Reset(wait)
			retry = min(retry*2, interval)
		case !ok:
			le.end(le.notOurs())
			return
		default:
			lastOK = sent
			unproven.Reset(proven(lastOK))
			beat.Reset(interval)
			retry = min(interval, 100*time.Millisecond)
		}
	}
}

// extend extends every key of the lease: its own (with the shared keys in their slot),
// then the shared keys held apart. Any not ours loses the lease.
func (le *Lease) extend(ctx context.Context) (bool, error) {
	ok, err := le.extendOwn(ctx)
	if ok && err == nil && le.apart {
		ok, err = le.extendApart(ctx)
	}
	return ok, err
}

// extendApart extends the shared keys held in another hash slot (extend.lua there;
// with WaitReplicas, followed by a WAIT on their own primary).
func (le *Lease) extendApart(ctx context.Context) (bool, error) {
	if le.l.opts.WaitReplicas > 0 {
		return le.extendReplicatedKeys(ctx, le.apartKeys(), false, 0)
	}
	n, err := extendScript.Run(ctx, le.l.rdb, le.apartKeys(), le.token, le.l.ttlMS).Int64()
	return n == 1, err
}

func (le *Lease) extendOwn(ctx context.Context) (bool, error) {
	if le.l.opts.WaitReplicas > 0 {
		return le.extendReplicated(ctx)
	}
	keys, nslots := le.extendKeys()
	if le.onBeat == nil {
		n, err := extendScript.Run(ctx, le.l.rdb, keys, le.token, le.l.opts.TTL.Milliseconds(), nslots).Int64()
		return n == 1, err
	}
	cmds, err := le.pipelined(ctx, keys, func(pipe redis.Pipeliner, script func(*redis.Script) *redis.Cmd) {
		script(extendScript.Script())
		le.onBeat(ctx, pipe)
	}, le.l.opts.TTL.Milliseconds(), nslots)
	if err != nil {
		return false, err
	}
	n, err := cmds[0].(*redis.Cmd).Int64()
	return n == 1, err
}

// pipelined runs a lease script (KEYS lock, info; ARGV token, extra...) followed by
// the caller's commands in one round trip, by EVALSHA, and again by EVAL if the
// server had lost the script (NOSCRIPT after a restart or SCRIPT FLUSH). Errors of the
// caller's commands are not returned: only the script's and the connection's.
func (le *Lease) pipelined(ctx context.Context, keys []string, fill func(pipe redis.Pipeliner, script func(*redis.Script) *redis.Cmd), extra ...any) ([]redis.Cmder, error) {
	args := append([]any{le.token}, extra...)
	run := func(sha bool) ([]redis.Cmder, error) {
		pipe := le.l.rdb.Pipeline()
		fill(pipe, func(s *redis.Script) *redis.Cmd {
			if sha {
				return s.EvalSha(ctx, pipe, keys, args...)
			}
			return s.Eval(ctx, pipe, keys, args...)
		})
		cmds, err := pipe.Exec(ctx)
		if len(cmds) == 0 {
			return cmds, err
		}
		return cmds, cmds[0].Err()
	}
	cmds, err := run(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmds, err = run(false)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return cmds, err
	}
	return cmds, nil
}

// notOurs is the cause of the lease's end when the heartbeat found its key not ours: a
// *SupersededByError when a newer event took it over (its stop hash names this lease's
// token: the announcement was missed), else ErrLeaseLost.
func (le *Lease) notOurs() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pipe := le.l.rdb.Pipeline()
	get := pipe.HGet(ctx, le.keys.Stop, le.token)
	_, _ = pipe.Exec(ctx)
	if v, err := get.Result(); err == nil {
		if f := strings.Fields(v); len(f) == 3 {
			fence, _ := strconv.ParseInt(f[2], 10, 64)
			return &SupersededByError{Agent: le.agent, Issue: le.issue, ByMessageID: f[1], Fence: fence}
		}
	}
	return fmt.Errorf("%w: found %s not ours", ErrLeaseLost, le.keys.Lock)
}

// Supersede ends the lease's run in favour of the newer event by, which could not
// take the lease over itself (it waits in the holder's own read-ahead, behind this
// run): the context is cancelled with a *SupersededByError naming it (Fence 0: the
// newer run's fence is taken when it acquires). The key stays ours until Release, and
// the newer event runs only after it.
func (le *Lease) Supersede(by string) {
	le.end(&SupersededByError{Agent: le.agent, Issue: le.issue, ByMessageID: by})
}

// Supersedes is the stream entry whose run this lease took over (AcquireOptions.
// Supersede), or "".
func (le *Lease) Supersedes() string { return le.supersedes }

// WaitStopped returns once every run superseded on this lease has stopped (its holder
// released its lease, or its key would have expired by now: a dead holder), at once
// when the acquire found none. Every acquire looks, in its own script, whatever its
// policy (the stop hash is the key's own state: a run superseded by another worker's
// take-over, given back since, may still be stopping on a key found free). It polls
// Redis, every 10 ms at first and then at most every 200 ms. If the lease ends first
// (superseded in turn, lost, or its context cancelled), it returns the cause.
func (le *Lease) WaitStopped() error {
	if le.stopping == 0 {
		return nil
	}
	wait := 10 * time.Millisecond
	for {
		n, err := le.stillStopping(le.ctx)
		if cerr := le.ctx.Err(); cerr != nil {
			return context.Cause(le.ctx)
		}
		if err == nil && n == 0 {
			return nil
		}
		// A failed poll proves nothing: the next one asks again (the heartbeat decides
		// whether the lease itself is still ours).
		t := time.NewTimer(wait)
		select {
		case <-le.ctx.Done():
			t.Stop()
			return context.Cause(le.ctx)
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// stillStopping is how many runs superseded on the lease's key have not stopped yet,
// other than the lease's own (stop_wait.lua): what WaitStopped waits on.
func (le *Lease) stillStopping(ctx context.Context) (int64, error) {
	return stopWaitScript.Run(ctx, le.l.rdb, []string{le.keys.Stop}, le.token).Int64()
}

// stopped tells the lease's newer holder, if a newer event superseded this one, that
// this run has stopped: it deletes the lease's field of the stop hash. It is called
// when a release found the key not ours (after a take-over, the key holds the newer
// token); a failure leaves the field to its deadline, the old key's expiry.
func (le *Lease) stopped(ctx context.Context) {
	pipe := le.l.rdb.Pipeline()
	pipe.HDel(ctx, le.keys.Stop, le.token)
	if _, err := pipe.Exec(ctx); err != nil {
		le.log().Warn().Err(err).Msg("could not tell a newer holder that this run stopped; it waits for this lease's expiry")
	}
}

// endOnce reports whether this is the lease's first end, a loss or a release, so that
// the Observer counts each lease once: lost or released. An eviction, the eviction
// watch's catch-up, the heartbeat's verdict and the holder's release may end one lease
// at the same time.
func (le *Lease) endOnce() bool { return le.ending.CompareAndSwap(false, true) }

// beginRelease stops the heartbeat and ends the lease's context (ErrReleased), as
// every release does first; first says whether this release is the lease's end to
// count (Observer.Released): no loss or earlier release came first, and its context
// had not ended with its message's.
func (le *Lease) beginRelease() (first bool) {
	le.stopHeartbeat()
	first = le.endOnce() && le.ctx.Err() == nil
	le.cancel(ErrReleased)
	return first
}

// end cancels the lease context with cause and stops extending; the key then expires on
// its own (or is deleted by Release). Loss is loud: logged at error level and counted.
func (le *Lease) end(cause error) {
	if le.ctx.Err() != nil || !le.endOnce() {
		return
	}
	// Log and count before cancelling, so whoever wakes on the cancellation sees both.
	ev := le.log().Error()
	if errors.Is(cause, ErrSuperseded) {
		ev = le.log().Info() // the policy at work, not a fault
	}
	ev.Err(cause).Str("message_id", le.messageID).
		Dur("held", time.Since(le.acquiredAt)).Msg("lease lost: holder's context cancelled")
	le.l.opts.Observer.Lost(le.agent, cause)
	le.cancel(cause)
}

// Release stops the heartbeat and deletes the lease if it is still ours. It is
// idempotent. A failure (Redis down) is logged and returned; the key then expires by
// its TTL. The returned bool says whether this call deleted the key, and each of its
// shared keys still ours: false when another run held one of them meanwhile.
func (le *Lease) Release(ctx context.Context) (bool, error) {
	return le.ReleaseWith(ctx, nil)
}

// The outcomes a release tells its script (release in scripts/lease.lua): a run
// happened under the lease, or none did and it is given back. Only a run writes the
// done record that makes older events count as superseded.
const (
	outcomeRan       = "ran"
	outcomeGivenBack = "given_back"
)

// GiveBack ends a lease under which no run happened (taken ahead for an entry that
// never reached the middleware, not acknowledged by the replicas, or a take-over whose
// wait for the old run ended first): as Release, but it records no release. A release
// record makes the events that entered before it count as superseded, and no run
// covered them. A follow-up queued behind the lease meanwhile is published.
func (le *Lease) GiveBack(ctx context.Context) error {
	_, err := le.release(ctx, nil, outcomeGivenBack)
	return err
}

// giveBack is GiveBack for paths that have nobody to tell of a failure: the key then
// expires by its TTL (logged by release).
func (le *Lease) giveBack(ctx context.Context) { _ = le.GiveBack(ctx) }

// ReleaseWith is Release followed by extra commands (the middleware acks its stream
// entry this way): they are sent only once the release has succeeded, in a second
// round trip, so they can never take effect before it, whatever the server's script
// cache holds and however a Cluster client splits a pipeline across nodes. An error of
// the extra commands is returned after the release is done, wrapping ErrAfterRelease.
func (le *Lease) ReleaseWith(ctx context.Context, then func(pipe redis.Pipeliner)) (bool, error) {
	return le.release(ctx, then, outcomeRan)
}

// release is ReleaseWith with the lease's outcome: outcomeRan records the release for
// the lease's message (the superseded checks), outcomeGivenBack records nothing.
// Every path publishes the lease's queued follow-up, if it has one (releaseScripted).
func (le *Lease) release(ctx context.Context, then func(pipe redis.Pipeliner), outcome string) (bool, error) {
	if le.line != nil {
		return le.releaseLineLease(ctx, then, outcome)
	}
	first := le.beginRelease()
	deleted, err := le.unlockApart(ctx)
	if err == nil {
		res, rerr := le.runRelease(ctx, outcome, "", "").Slice()
		deleted, err = le.releaseScripted(ctx, outcome, res, rerr)
	}
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err != nil {
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).
			Msg("lease release failed; the key will expire by its TTL")
		return false, fmt.Errorf("lease: release %s: %w", le.keys.Lock, err)
	}
	if !deleted {
		le.stopped(ctx)
	}
	return deleted, le.afterRelease(ctx, then)
}

// unlockApart releases the shared keys held apart (a group key on Redis Cluster, in
// another hash slot) by a script of their own, before release.lua releases the keys of
// the lease's slot, so that the issue's next run never finds this run's group key
// still held. Nothing to do without such keys.
func (le *Lease) unlockApart(ctx context.Context) (bool, error) {
	if !le.apart {
		return false, nil
	}
	return false, unlockSharedScript.Run(ctx, le.l.rdb, le.apartKeys(), le.token).Err()
}

// afterRelease sends then's commands, once the release has succeeded; their failure
// wraps ErrAfterRelease.
func (le *Lease) afterRelease(ctx context.Context, then func(pipe redis.Pipeliner)) error {
	if then == nil {
		return nil
	}
	pipe := le.l.rdb.Pipeline()
	then(pipe)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: %s: %w", ErrAfterRelease, le.keys.Lock, err)
	}
	return nil
}

// maxDrainRounds bounds the Cluster drain loop: each round publishes a follow-up that
// replaced the one published in the round before, which takes an event per round.
const maxDrainRounds = 8

// Arguments of release.lua and handoff.lua that are the same for every lease, boxed
// once (by pointer: see runScript).
var (
	modeStandalone, modeCluster = "1", "0"
	indexMax                    = int64(xonce.IndexMax)
	indexTTLms                  = xonce.IndexTTL.Milliseconds()
)

// releaseArgs returns runScript's args for release.lua: KEYS lock, info, done, queue,
// mailbox and the shared keys' lock and info, then ARGV (see the script). The lease's
// own by pointer: the release is on every event's path.
func (le *Lease) releaseArgs(outcome string, published, publishedMS *string) ([]any, int) {
	mode := &modeStandalone
	if le.l.opts.Format == KeysCluster {
		mode = &modeCluster
	}
	// Shared keys held apart are released by unlockApart, not in this slot's script.
	var shared []SharedLease
	if !le.apart {
		shared = le.shared
	}
	nkeys := 5 + 2*len(shared)
	args := append(scriptArgs(nkeys+10), &le.keys.Lock, &le.keys.Info, &le.keys.Done, &le.keys.Queue, &le.keys.Mailbox)
	for i := range shared {
		args = append(args, &shared[i].Keys.Lock, &shared[i].Keys.Info)
	}
	return append(args, &le.token, outcome, &le.entry, mode, &le.maxLen, published,
		&le.issue, &indexMax, &indexTTLms, publishedMS), nkeys
}

// runRelease sends release.lua once. published is the _qid of the follow-up the
// caller has appended (Cluster) and publishedID its stream id, or both "".
func (le *Lease) runRelease(ctx context.Context, outcome, published, publishedID string) *redis.Cmd {
	ms, _, _ := strings.Cut(publishedID, "-")
	args, nkeys := le.releaseArgs(outcome, &published, &ms)
	sc := releaseScript
	if le.slots != nil {
		sc, nkeys, args = le.slots.withReleaseSlots(sc, nkeys, args)
	}
	return runScript(ctx, le.l.rdb, sc, nkeys, args)
}

// releaseScripted follows release.lua's reply res (or err) to the end of the release:
// on Redis Cluster, while the script answers with a queued follow-up to publish
// ({3, ...}), it publishes it (once, by its _qid: xonce) and runs the script again, so
// a crash in between leaves the follow-up queued for the next holder rather than
// lost. It reports whether the lease was deleted, and keeps the published follow-up's
// id for Requeued.
func (le *Lease) releaseScripted(ctx context.Context, outcome string, res []any, err error) (bool, error) {
	for range maxDrainRounds {
		if err != nil {
			return false, err
		}
		if len(res) == 0 {
			return false, fmt.Errorf("unexpected reply %v", res)
		}
		if atoi(res[0]) != 3 {
			if len(res) >= 3 && atoi(res[1]) == 1 {
				le.requeued.Store(fmt.Sprint(res[2]))
			}
			return atoi(res[0]) == 1, nil
		}
		qid, perr := le.publishQueued(ctx, res[1:])
		if perr != nil {
			return false, perr
		}
		res, err = le.runRelease(ctx, outcome, qid, le.Requeued()).Slice()
	}
	return false, fmt.Errorf("lease: drain %s: the queued follow-up kept being replaced", le.keys.Queue)
}

// publishQueued appends the queued follow-up q (field, value, ...: the queue hash) to
// its stream, once by its _qid, and returns that _qid (Redis Cluster: the stream is in
// another slot than the lease).
func (le *Lease) publishQueued(ctx context.Context, q []any) (string, error) {
	values := map[string]any{}
	stream, qid := "", ""
	for i := 0; i+1 < len(q); i += 2 {
		switch k := fmt.Sprint(q[i]); k {
		case "_stream":
			stream = fmt.Sprint(q[i+1])
		case "_qid":
			qid = fmt.Sprint(q[i+1])
		case "_mbox":
		default:
			values[k] = q[i+1]
		}
	}
	id, err := xonce.Run(ctx, le.l.rdb, xonce.Append{Stream: stream, ID: "follow-up-" + le.keys.Queue + "-" + qid,
		Issue: le.issue, Values: values, MaxLen: le.maxLen, TTL: le.l.opts.MaxHold + le.l.opts.TTL})
	if err != nil {
		return "", fmt.Errorf("lease: publish queued follow-up to %s: %w", stream, err)
	}
	le.requeued.Store(id)
	return qid, nil
}

// Requeued is the stream id of the follow-up event that Release published (coalesce
// policy), or "".
func (le *Lease) Requeued() string {
	s, _ := le.requeued.Load().(string)
	return s
}

// Check proves, in one round trip, that the lease is still ours (its key and each of
// its shared keys): nil, or an error wrapping ErrLeaseLost (also when the heartbeat
// already gave it up).
func (le *Lease) Check(ctx context.Context) error {
	if err := le.Err(); err != nil && !errors.Is(err, ErrReleased) {
		return fmt.Errorf("%w: %v", ErrLeaseLost, err) //nolint:errorlint // callers see one kind, ErrLeaseLost, not the heartbeat's cause
	}
	return le.checkLocks(ctx)
}

// XAdd appends values to stream only while the lease is held (its key and each of its
// shared keys): the check and the append
// are one script, so a holder that lost its lease (expired, taken, force-released)
// cannot publish. maxLen > 0 trims approximately. It returns the new entry's id, or an
// error wrapping ErrLeaseLost. On Redis Cluster (KeysCluster) the stream lives in
// another slot, so the check and the append are two steps there.
//
// An append is safe to repeat: go-redis sends it again when its reply is lost, and the
// repeat returns the first entry's id instead of appending a second copy (xonce).
func (le *Lease) XAdd(ctx context.Context, stream string, maxLen int64, values map[string]any) (string, error) {
	return le.XAddOnce(ctx, stream, maxLen, le.token+"-"+strconv.FormatInt(le.appends.Add(1), 10), appendOnceTTL, values)
}

// XAddOnce is XAdd under an append id the caller chose (xonce.Append.ID), remembered
// for ttl: an append that names what it records (one outcome per event) adds nothing
// when that was appended before, by this lease or an earlier one, and returns the
// first entry's id. That repeat is not refused once the lease is lost: it writes nothing.
func (le *Lease) XAddOnce(ctx context.Context, stream string, maxLen int64, once string, ttl time.Duration, values map[string]any) (string, error) {
	if err := le.Err(); err != nil && !errors.Is(err, ErrReleased) {
		return "", fmt.Errorf("%w: %v", ErrLeaseLost, err) //nolint:errorlint // callers see one kind, ErrLeaseLost, not the heartbeat's cause
	}
	a := xonce.Append{Stream: stream, ID: once, Values: values, MaxLen: maxLen, TTL: ttl}
	if le.l.opts.Format == KeysCluster {
		if err := le.Check(ctx); err != nil {
			return "", err
		}
	} else {
		a.Lock, a.Locks, a.Token = le.keys.Lock, le.sharedLocks(), le.token
	}
	id, err := xonce.Run(ctx, le.l.rdb, a)
	if errors.Is(err, xonce.ErrLeaseLost) {
		return "", fmt.Errorf("%w: publish to %s refused (fence %d)", ErrLeaseLost, stream, le.fence)
	}
	if err != nil {
		return "", fmt.Errorf("lease: fenced xadd %s: %w", stream, err)
	}
	return id, nil
}

// appendOnceTTL is how long a fenced append is recognised if sent again: only
// go-redis's own retries repeat it (a handler's retry makes a new append), so a minute
// is ample and the markers stay few.
const appendOnceTTL = time.Minute

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func atoi(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
