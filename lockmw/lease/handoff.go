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
	// Pauses, when set, have HandoffBatch (standalone Redis) check them for the lease
	// in its own script, Stream naming the entry's stream: a burst of quick events
	// then costs no pause round trip each (Pending.PauseChecked). Handoff ignores them.
	Pauses *Pauses
	Stream string
}

// Pending is a lease taken ahead of its entry by Handoff: held (Err is nil) or refused
// (Err says why: a *LockedError, a *SupersededError, an ErrInvalidKey error or a Redis
// error). Its heartbeat runs from the hand-off on; its context is detached until Take
// binds it to its entry's context.
type Pending struct {
	id    string // the stream entry it was taken for
	lease *Lease // nil when err is set
	err   error
	// checked: HandoffBatch's script found no pause and the entry never parked,
	// atomically with the acquire (PauseChecked).
	checked bool
}

// PauseChecked reports whether the lease's pause check was done with its acquire, in
// HandoffBatch's script (Next.Pauses), and let the entry run: no pause existed and
// the entry had never been parked. The check then needs no round trip of its own: it
// was made after the lease was written, so a pause written since finds the lease
// held, and its writer's listing of the scope's leases names it (pause.go). False
// for a lease not taken, or whose check the worker must make (Pauses.Check).
func (p *Pending) PauseChecked() bool { return p != nil && p.lease != nil && p.checked }

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

// Unbind unties a lease from the context it was acquired under (or Take tied it to),
// as its release does: that context's end no longer ends the lease. A run whose
// release waits for a batch calls it once the run has ended: its entry is acked (and
// its context ended) before the batch is sent, and that end must not end the lease
// before its release, nor start a goroutine to do it (one per event).
func (le *Lease) Unbind() {
	if le.unbind != nil {
		le.unbind()
	}
}

// GiveBack deletes a lease taken ahead whose entry did not come: no run happened under
// it, so its release records none (an event that entered before it is not superseded
// by it). It does nothing for a nil Pending or one whose lease was not taken.
func (p *Pending) GiveBack(ctx context.Context) {
	if p != nil && p.lease != nil {
		p.lease.giveBack(ctx)
	}
}

// Handoff ends the run of the lease's entry e: it releases the lease (publishing its
// queued follow-up, if it has one), then acks e (XACK), and, when next is not nil,
// takes next's lease ahead. On standalone Redis that is one script in one round trip
// (the ack can never come before the release). On Redis Cluster (KeysCluster) the ack
// is sent only once the release has succeeded, in a second round trip, as ReleaseWith
// does. A lease that drains (AcquireOptions.Drain) or holds shared keys takes nothing
// ahead (next is ignored). A failure of the ack alone wraps ErrAfterRelease: the lease
// is gone.
//
// The Pending is nil when next is nil, or when next is of this same lease and had to
// wait for a queued follow-up to be published (Cluster): its entry acquires when it
// comes. Otherwise it holds next's lease or why it was not taken.
func (le *Lease) Handoff(ctx context.Context, e Entry, next *Next) (*Pending, error) {
	if le.line != nil {
		// Policy wait: its own release script hands the key to the line's head.
		return nil, le.finishLine(ctx, e)
	}
	if le.drain || len(le.shared) > 0 {
		// A lease with shared keys releases them in its own script (release.lua): the
		// middleware takes nothing ahead for scoped handlers, nor for draining ones.
		next = nil
	}
	var p *Pending
	var err error
	switch {
	case len(le.shared) > 0:
		_, err = le.ReleaseWith(ctx, ack(ctx, e))
	case le.l.opts.Format != KeysCluster:
		// Standalone: one script does all three.
		_, p, err = le.releaseAck(ctx, e, next)
	case next != nil:
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
// script cache cannot make the round trip half-fail. A release that must first publish
// a queued follow-up changed nothing in that round trip (releaseScripted goes on);
// next's acquire then found this very lease busy if next is of the same lease, and no
// Pending is returned for it.
func (le *Lease) releaseAndAcquire(ctx context.Context, then func(pipe redis.Pipeliner), next *Next) (bool, *Pending, error) {
	first := le.beginRelease()
	a, prepErr := le.l.prepareNext(next)
	pipe := le.l.rdb.Pipeline()
	published, publishedMS := "", ""
	args, nkeys := le.releaseArgs(outcomeRan, &published, &publishedMS)
	rel := releaseScript.Eval(ctx, pipe, toStrings(args[3:3+nkeys]), args[3+nkeys:]...)
	var acq *redis.Cmd
	if prepErr == nil {
		acq = acquireScript.Eval(ctx, pipe, a.scriptKeys(), a.args...)
	}
	_, _ = pipe.Exec(ctx)
	res, err := rel.Slice()
	drained := err == nil && len(res) > 0 && atoi(res[0]) == 3
	deleted, err := le.releaseScripted(ctx, outcomeRan, res, err)
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err != nil {
		le.log().Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lease: release %s: %w", le.keys.Lock, err)
	} else {
		if !deleted {
			le.stopped(ctx)
		}
		err = le.afterRelease(ctx, then)
	}
	p := &Pending{id: next.Options.MessageID, err: prepErr}
	if prepErr == nil {
		res, aerr := acq.Slice()
		p.lease, p.err = a.finish(context.Background(), res, aerr)
		if drained && p.lease == nil && a.keys.Lock == le.keys.Lock {
			p = nil // refused by this lease, which its acquire met before the release
		}
	}
	return deleted, p, err
}

// toStrings turns the keys of releaseArgs (strings, most by pointer) into the
// []string of a pipelined Eval.
func toStrings(keys []any) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		switch k := k.(type) {
		case *string:
			out[i] = *k
		case string:
			out[i] = k
		}
	}
	return out
}

// releaseAck ends an event on standalone Redis in one round trip and one script
// (handoff.lua): release le, XACK e, and take next's lease if next is set. It is sent
// by EVALSHA; if the server lost the script, nothing ran and it is sent again by EVAL.
func (le *Lease) releaseAck(ctx context.Context, e Entry, next *Next) (bool, *Pending, error) {
	first := le.beginRelease()
	var a *acquisition
	var p *Pending
	if next != nil {
		var err error
		a, err = le.l.prepareNext(next)
		p = &Pending{id: next.Options.MessageID, err: err}
	}
	// KEYS lock, info, done, queue, mailbox, stream[, next's 5]; ARGV token,
	// message_id, group, entry id, maxlen, issue, index max, index TTL[, next's 6], the
	// lease's own by pointer (see acquisition.kv).
	args := append(scriptArgs(24), &le.keys.Lock, &le.keys.Info, &le.keys.Done, &le.keys.Queue, &le.keys.Mailbox, e.Stream)
	nkeys := 6
	if a != nil {
		args = append(args, a.kv[:kvKeys]...)
		nkeys = 6 + kvKeys
	}
	var id any = &le.messageID // the entry's id, which the lease was taken for
	if e.ID != le.messageID {
		id = e.ID
	}
	args = append(args, &le.token, &le.entry, e.Group, id, &le.maxLen, &le.issue, &indexMax, &indexTTLms)
	if a != nil {
		args = append(args, a.kv[kvKeys:]...)
	}
	sc := handoffScript
	if le.slots != nil {
		// The run's slots are freed, each handed on, in the same script.
		sc, nkeys, args = le.slots.withReleaseSlots(sc, nkeys, args)
	}
	res, err := runScript(ctx, le.l.rdb, sc, nkeys, args).Slice()
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err == nil && len(res) < 3 {
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
	if id, _ := res[2].(string); id != "" {
		le.requeued.Store(id)
	}
	if p != nil && p.err == nil {
		p.lease, p.err = a.finish(context.Background(), res[3:], nil)
	}
	return atoi(res[0]) == 1, p, nil
}

// errQueueAhead refuses a Next whose options queue: acquire_or_queue has no place in
// the hand-off's script.
var errQueueAhead = errors.New("lease: a lease taken ahead cannot queue (Next.Options.Queue)")

// errSharedAhead refuses a Next with shared keys: handoff.lua takes the lease's own
// keys only.
var errSharedAhead = errors.New("lease: a lease taken ahead cannot hold shared keys (Next.Options.Shared)")

// errPolicyAhead refuses a Next whose options ask for another acquire than the plain
// one (supersede, deliver, wait, slots): the hand-off's scripts take plain leases only.
var errPolicyAhead = errors.New("lease: a lease taken ahead is a plain one (Next.Options.Supersede, Deliver, Wait, LineHold and Slots must be unset)")

// prepareNext is prepare for a lease taken ahead.
func (l *Locker) prepareNext(next *Next) (*acquisition, error) {
	if next.Options.Queue != nil {
		return nil, errQueueAhead
	}
	if o := next.Options; o.Supersede || o.Deliver != nil || o.Wait != nil || o.LineHold > 0 || o.Slots != nil {
		return nil, errPolicyAhead
	}
	if len(next.Options.Shared) > 0 {
		return nil, errSharedAhead
	}
	return l.prepare(next.Agent, next.Key, next.Options)
}
