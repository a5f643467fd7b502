package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The hand-off: the end of one stream entry's run and the start of the next one's. When
// the consumer knows the entry it delivers next, Handoff takes that entry's lease in the
// round trip that releases the current one and acks its entry, so the next lease costs
// no round trip of its own on the critical path. A lease taken ahead (a Pending) is
// bound to its entry's context with Take when the entry arrives, or given back with
// GiveBack if another entry arrives instead or none comes.

// Entry names a stream entry of a consumer group: the entry a lease was taken for,
// which Handoff acks.
type Entry struct {
	Stream, Group, ID string
}

// Next names the lease Handoff takes ahead, for the entry delivered next.
type Next struct {
	Agent string
	// Key is the entry's raw issue key; it is canonicalised.
	Key string
	// Options of the acquire; their MessageID names the entry. Queue must be nil: a
	// lease taken ahead cannot queue its entry on a conflict.
	Options AcquireOptions
}

// Pending is a lease taken ahead of its entry by Handoff: held (Err is nil) or refused
// (Err says why: a *LockedError, a *SupersededError, an ErrInvalidKey error or a Redis
// error). Its heartbeat runs from the hand-off on; its context is detached until Take
// binds it to its entry's context.
type Pending struct {
	id    string // the stream entry it was taken for
	lease *Lease // nil when err is set
	err   error
}

// MessageID is the stream entry the lease was taken for (Next.Options.MessageID).
func (p *Pending) MessageID() string { return p.id }

// Err is nil when the lease was taken, else why not.
func (p *Pending) Err() error { return p.err }

// Take ties the pending lease to ctx (its entry's context): cancelling ctx cancels the
// lease's context with ctx's cause, as for a lease acquired under ctx. It returns Err
// when the lease was not taken.
func (p *Pending) Take(ctx context.Context) (*Lease, error) {
	if p.err != nil {
		return nil, p.err
	}
	le := p.lease
	// A lease taken ahead is confirmed by the replicas only now, once its entry has
	// come (Options.WaitReplicas): the hand-off's round trip stays one.
	if err := le.replicated(ctx); err != nil {
		return nil, err
	}
	le.unbind = context.AfterFunc(ctx, func() { le.cancel(context.Cause(ctx)) })
	return le, nil
}

// GiveBack deletes a lease taken ahead whose entry did not come: no run happened under
// it, so its release records none (an event that entered before it is not superseded
// by it). It does nothing for a nil Pending or one whose lease was not taken.
func (p *Pending) GiveBack(ctx context.Context) {
	if p != nil && p.lease != nil {
		p.lease.giveBack(ctx)
	}
}

// Handoff ends the run of the lease's entry e: it releases the lease, then acks e
// (XACK), and, when next is not nil, takes next's lease ahead. On standalone Redis that
// is one script in one round trip (the ack can never come before the release). On
// Redis Cluster (KeysCluster), or for a lease that drains a queued follow-up
// (AcquireOptions.Drain), the ack is sent only once the release has succeeded, in a
// second round trip, as ReleaseWith does; a draining lease takes nothing ahead (next is
// ignored). A failure of the ack alone wraps ErrAfterRelease: the lease is gone.
//
// The Pending is nil when next is nil; otherwise it holds next's lease or why it was
// not taken.
func (le *Lease) Handoff(ctx context.Context, e Entry, next *Next) (*Pending, error) {
	var p *Pending
	var err error
	switch {
	case len(le.shared) > 0:
		// A lease with shared keys releases them in its own script (release.lua) and
		// takes nothing ahead: the middleware does not peek for scoped handlers.
		_, err = le.ReleaseWith(ctx, ack(ctx, e))
	case le.l.opts.Format != KeysCluster && !le.drain:
		// Standalone: one script does all three.
		_, p, err = le.releaseAck(ctx, e, next)
	case next != nil && !le.drain:
		_, p, err = le.releaseAndAcquire(ctx, ack(ctx, e), next)
	default:
		_, err = le.ReleaseWith(ctx, ack(ctx, e))
	}
	return p, err
}

// ack queues the XACK of e (on Redis Cluster the stream and the lease are in different
// slots, so the ack is a command of its own behind the release script).
func ack(ctx context.Context, e Entry) func(redis.Pipeliner) {
	return func(pipe redis.Pipeliner) { pipe.XAck(ctx, e.Stream, e.Group, e.ID) }
}

// releaseAndAcquire ends an event on Redis Cluster: it releases le and acquires next
// in one round trip (a cluster pipeline, sent to each key's node), and only once the
// release has succeeded runs then (the XACK) in a second one. The stream is in another
// slot than the lease, and a cluster pipeline sends each node its commands
// concurrently, so one round trip could not keep the ack after the release. The
// pending lease's heartbeat runs from now on; its context is detached until Take binds
// it to its event's context. Both scripts are sent by EVAL, so a server that lost its
// script cache cannot make the round trip half-fail.
func (le *Lease) releaseAndAcquire(ctx context.Context, then func(pipe redis.Pipeliner), next *Next) (bool, *Pending, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	a, prepErr := le.l.prepareNext(next)
	pipe := le.l.rdb.Pipeline()
	rel := releaseScript.Eval(ctx, pipe, []string{le.keys.Lock, le.keys.Info, le.keys.Done}, le.token, le.messageID)
	var acq *redis.Cmd
	if prepErr == nil {
		acq = acquireScript.Eval(ctx, pipe, a.scriptKeys(), a.args...)
	}
	_, _ = pipe.Exec(ctx)
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	n, err := rel.Int64()
	if err != nil {
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lease: release %s: %w", le.keys.Lock, err)
	} else {
		if n != 1 {
			le.stopped(ctx)
		}
		err = le.afterRelease(ctx, then)
	}
	p := &Pending{id: next.Options.MessageID, err: prepErr}
	if prepErr == nil {
		res, aerr := acq.Slice()
		p.lease, p.err = a.finish(context.Background(), res, aerr)
	}
	return n == 1, p, err
}

// releaseAck ends an event on standalone Redis in one round trip and one script
// (handoff.lua): release le, XACK e, and take next's lease if next is set. It is sent
// by EVALSHA; if the server lost the script, nothing ran and it is sent again by EVAL.
func (le *Lease) releaseAck(ctx context.Context, e Entry, next *Next) (bool, *Pending, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	var a *acquisition
	var p *Pending
	if next != nil {
		var err error
		a, err = le.l.prepareNext(next)
		p = &Pending{id: next.Options.MessageID, err: err}
	}
	// KEYS lock, info, done, stream[, next's 4]; ARGV token, message_id, group, entry
	// id[, next's 6], the lease's own by pointer (see acquisition.kv).
	args := append(scriptArgs(18), &le.keys.Lock, &le.keys.Info, &le.keys.Done, e.Stream)
	nkeys := 4
	if a != nil {
		args = append(args, a.kv[:4]...)
		nkeys = 8
	}
	var id any = &le.messageID // the entry's id, which the lease was taken for
	if e.ID != le.messageID {
		id = e.ID
	}
	args = append(args, &le.token, &le.messageID, e.Group, id)
	if a != nil {
		args = append(args, a.kv[4:]...)
	}
	res, err := runScript(ctx, le.l.rdb, handoffScript, nkeys, args).Slice()
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err == nil && len(res) < 2 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lease: release %s: %w", le.keys.Lock, err)
		if p != nil && p.err == nil {
			p.err = err
		}
		return false, p, err
	}
	if atoi(res[0]) != 1 {
		le.stopped(ctx)
	}
	if p != nil && p.err == nil {
		p.lease, p.err = a.finish(context.Background(), res[2:], nil)
	}
	return atoi(res[0]) == 1, p, nil
}

// errQueueAhead refuses a Next whose options queue: acquire_or_queue has no place in
// the hand-off's script.
var errQueueAhead = errors.New("lease: a lease taken ahead cannot queue (Next.Options.Queue)")

// errSharedAhead refuses a Next with shared keys: handoff.lua takes the lease's own
// keys only.
var errSharedAhead = errors.New("lease: a lease taken ahead cannot hold shared keys (Next.Options.Shared)")

// prepareNext is prepare for a lease taken ahead.
func (l *Locker) prepareNext(next *Next) (*acquisition, error) {
	if next.Options.Queue != nil {
		return nil, errQueueAhead
	}
	if len(next.Options.Shared) > 0 {
		return nil, errSharedAhead
	}
	return l.prepare(next.Agent, next.Key, next.Options)
}
