package lockmw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// How a run under a lease ends, in one place (asynq's processor and River's executor
// end a job the same way): Handler's step 6 (ended) says how it ended, as a value
// (runEnd), and step 7 (finish) turns that value into the Redis writes its row of the
// lease's state table asks for (docs/architecture.md). An event that got no lease ends
// in conflict.go instead (dropped, coalesced, delayed, delivered, superseded, waited),
// or in wait.go (ranAlready: a copy of a waiting event that ran already).

// endKind is how a run under a lease ended.
type endKind int

const (
	// endRan: the handler returned nil and the lease is held: release (outcome ran)
	// and ack in one round trip, taking the next entry's lease ahead when known; a
	// release of a key that may have a line (policy Wait) hands it to the line's head.
	endRan endKind = iota
	// endFailed: the handler failed and the lease is held: release before the error
	// goes back, so a retry is not dropped as locked.
	endFailed
	// endStands: a newer event took the issue over after the run had finished: its
	// fenced writes all landed before, so its outcome stands: release, ack, no record.
	endStands
	// endCancelled: a newer event took the issue over and the run (or its wait for an
	// older run) was cancelled: release (or give back), record it superseded, ack.
	endCancelled
	// endLost: the lease ended under the handler (lost, unproven, MaxHold, shutdown):
	// release (or give back); the entry stays pending unless the release proves the
	// run was exclusive.
	endLost
)

// String names the end, for logs.
func (k endKind) String() string {
	return [...]string{"ran", "failed", "stands", "cancelled", "lost"}[k]
}

// runEnd is the end of one run under a lease: how it ended, whether the handler ran
// (else its wait for a superseded run ended first: the lease is given back, not
// released), and what it returned.
type runEnd struct {
	kind endKind
	ran  bool
	out  []*message.Message
	err  error
	by   *lease.SupersededByError // endStands, endCancelled: the newer event
}

// ended is Handler's step 6: how the run under le ended, given whether it ran and the
// handler's (or the wait's) result.
func ended(d *delivery, le *lease.Lease, ran bool, out []*message.Message, err error) runEnd {
	e := runEnd{ran: ran, out: out, err: err, kind: endRan}
	if err != nil {
		e.kind = endFailed
	}
	if lost := le.Err(); lost != nil {
		endedLost(&e, d, lost)
	}
	return e
}

// endedLost is ended for a lease that ended before its release: superseded, or lost.
// It is out of ended's line so that the errors.As target costs the runs whose lease
// held no allocation.
func endedLost(e *runEnd, d *delivery, lost error) {
	var by *lease.SupersededByError
	switch {
	case errors.As(lost, &by) && d.hasEntry:
		e.kind, e.by = endCancelled, by
		if e.ran && e.err == nil {
			e.kind = endStands
		}
	case !errors.Is(lost, lease.ErrReleased):
		e.kind = endLost
	}
}

// finish is Handler's step 7: it ends the run as e says (the lease's release or
// give-back, the entry's ack, a record) and returns what the router gets: the
// handler's messages when the entry is done, an error when it goes back.
func (m *Middleware) finish(d *delivery, le *lease.Lease, e runEnd) ([]*message.Message, error) {
	if e.kind == endRan && d.hasEntry && m.batches(le) {
		// Most such ends wait for their batch and send nothing: no timeout of their own.
		return m.endInBatch(d, le, e.out)
	}
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 5*time.Second)
	defer cancel()
	switch e.kind {
	case endStands:
		// Release (telling the newer run this one stopped) and ack; no superseded record.
		if _, relErr := le.ReleaseWith(cleanup, m.ack(cleanup, d.entry)); relErr == nil {
			m.cfg.Source.Settle(d.entry)
		}
		d.log.get().Info().Str("superseded_by", e.by.ByMessageID).Msg("run finished as a newer event took the issue over; its outcome stands")
		return e.out, nil
	case endCancelled:
		return nil, m.cancelled(cleanup, d.msg, d.entry, le, e.by, e.ran, d.log)
	case endLost:
		return m.finishLost(cleanup, d, le, e)
	case endFailed:
		// Release before the nack, so the retry is not dropped as "locked".
		_, _ = le.Release(cleanup)
		return nil, e.err
	}
	return m.finishRan(cleanup, d, le, e.out)
}

// finishLost ends a run whose lease ended under the handler. If the handler finished
// and the key still held this lease's token when it was deleted, nobody else held the
// issue meanwhile: the run was exclusive and its outcome stands. A shutdown that lands
// between the handler's last write and its return is the common case; re-running the
// entry would record a second outcome. The ack is sent here, after the release,
// because the subscriber's own is not sent once it closes. Otherwise whatever the run
// did is unproven: the entry is left pending, redelivered (to the new holder's veto, or
// re-run once the lease is free).
func (m *Middleware) finishLost(ctx context.Context, d *delivery, le *lease.Lease, e runEnd) ([]*message.Message, error) {
	lost := le.Err()
	leaseEnded(d.ctx, lost)
	deleted, relErr := endAfterLoss(ctx, le, e.ran)
	if e.err == nil && relErr == nil && deleted {
		if d.hasEntry {
			m.ackExclusive(ctx, d, le)
		}
		d.log.get().Info().Err(lost).Msg("handler finished as its lease ended; the lease was still held, so the entry is acked")
		return e.out, nil
	}
	if errors.Is(lost, context.Canceled) && d.ctx.Err() != nil {
		d.log.get().Info().Msg("shutting down: lease released, entry left pending for immediate pickup")
	} else {
		d.log.get().Error().Err(lost).Msg("lease ended while the handler ran; entry left pending for redelivery")
	}
	return nil, fmt.Errorf("lockmw: %s %s: %w", m.cfg.Agent, le.Issue(), lost)
}

// ackExclusive acks the entry of a run that finished as its lease ended while the key
// still held the lease (finishLost). A wait lease's release gave the key back already;
// finishWaiting then records that the event ran, ends its turn, hands the key to the
// line's head and acks, in one round trip.
func (m *Middleware) ackExclusive(ctx context.Context, d *delivery, le *lease.Lease) {
	if le.Waits() {
		if m.finishWaiting(ctx, le, d.entry) == nil {
			m.cfg.Source.Settle(d.entry)
		}
		return
	}
	pipe := m.cfg.Locker.Client().Pipeline()
	m.ack(ctx, d.entry)(pipe)
	if _, ackErr := pipe.Exec(ctx); ackErr == nil {
		m.cfg.Source.Settle(d.entry)
	}
}

// finishRan ends a run that succeeded with its lease held: release, then ack, in one
// round trip (the subscriber's own XACK is skipped), taking the next entry's lease in
// it when the next entry is known. Without a stream entry it only releases.
func (m *Middleware) finishRan(cleanup context.Context, d *delivery, le *lease.Lease, out []*message.Message) ([]*message.Message, error) {
	if !d.hasEntry {
		if _, relErr := le.Release(cleanup); relErr != nil {
			d.log.get().Warn().Err(relErr).Msg("release failed; lease expires by its TTL")
		}
		return out, nil
	}
	switch relErr := m.releaseHandingOff(cleanup, le, d.entry); {
	case relErr == nil:
		m.cfg.Source.Settle(d.entry)
	case errors.Is(relErr, lease.ErrAfterRelease):
		d.log.get().Warn().Err(relErr).Msg("lease released, its ack failed; the subscriber retries the ack")
	default:
		// The work is done and recorded, but the lease may still be held: acking now
		// would leave a live lease that no pending entry covers (events for the issue
		// dropped as locked, none of them run), and re-running would do the work twice.
		// Release and ack are safe to repeat, so they are tried again until they
		// succeed or the lease has expired by itself.
		if err := m.releaseLater(d.ctx, le, d.entry, relErr, d.log); err != nil {
			return nil, err
		}
	}
	if id := le.Requeued(); id != "" {
		d.log.get().Info().Str("requeued_id", id).Msg("published the issue's queued follow-up")
	}
	return out, nil
}

// endAfterLoss is end for a lease that ended under its run (finishLost): a wait lease's
// event keeps its turn (lease.Lease.ReleaseLost), so that its entry, handed over again,
// takes the key back under its own id, where the handler kept the agent's result,
// instead of joining the line again and running the agent a second time as a new copy.
func endAfterLoss(ctx context.Context, le *lease.Lease, ran bool) (bool, error) {
	if !ran {
		return false, le.GiveBack(ctx)
	}
	return le.ReleaseLost(ctx)
}

// end releases le, or gives it back when no run happened under it (its wait for a
// superseded run to stop ended first): a give-back records no release, so no event
// counts as superseded by a run that did not happen.
func end(ctx context.Context, le *lease.Lease, ran bool) (bool, error) {
	if !ran {
		return false, le.GiveBack(ctx)
	}
	return le.Release(ctx)
}
