package subscriber

import (
	"context"
	"time"
)

// Drain (docs/operations.md, "Maintenance and upgrades: drain"): a drained subscriber
// reads nothing new and runs no claim pass, hands nothing more over, and gives the
// entries it read ahead back to the group: they stay pending, marked idle past
// MaxIdleTime (XCLAIM to itself with IDLE, JUSTID: their delivery count unchanged), so
// any other consumer's next claim pass takes them. Its fill loop does the giving back,
// so an entry a read in flight returns after the drain began is given back as well.
// The message handed over when the drain began runs to its end. Undrain reads again.

// drainState is the subscriber's drain, guarded by Subscriber.mu.
type drainState struct {
	on bool
}

// DrainObserver is told of the entries a drain gave back (an optional interface of
// the Observer): they are no longer this consumer's to run.
type DrainObserver interface {
	GaveBack(stream string, ids []string)
}

// Drain stops reading and handing over, and has the entries read ahead given back.
// Drained reports when it is done. Idempotent.
func (s *Subscriber) Drain() { s.setDrain(true) }

// Undrain ends a drain: the subscriber reads and claims again. Idempotent.
func (s *Subscriber) Undrain() { s.setDrain(false) }

func (s *Subscriber) setDrain(on bool) {
	s.mu.Lock()
	s.drain.on = on
	readers := append([]*reader(nil), s.readers...)
	for _, r := range readers {
		if !on {
			r.held, r.parked = false, false
		}
	}
	s.mu.Unlock()
	for _, r := range readers {
		signal(r.drained) // fill: give back, or read again
		signal(r.filled)  // run: hand over again
	}
}

// Draining reports whether a drain was asked for (and not undone).
func (s *Subscriber) Draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drain.on
}

// Drained reports whether a drain is complete: nothing handed over runs, nothing is
// read ahead or left to give back, and no read is in flight.
func (s *Subscriber) Drained() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.drain.on {
		return false
	}
	for _, r := range s.readers {
		if r.busy || !r.parked || len(r.ahead) > 0 {
			return false
		}
	}
	return true
}

// idle records that the message handed over ended (acked, or its context ended).
func (r *reader) idle() {
	r.s.mu.Lock()
	r.busy = false
	r.s.mu.Unlock()
	signal(r.drained)
}

// draining reports whether fill is to give back rather than read.
func (r *reader) draining() bool {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.s.drain.on
}

// giveBack takes the entries read ahead and marks them idle for the group. A failed
// XCLAIM keeps them to try again after retryWait: they stay pending for this consumer
// meanwhile (late for the others, never lost).
func (r *reader) giveBack(ctx context.Context) {
	r.giving = append(r.giving, r.takeAhead()...)
	if len(r.giving) == 0 {
		return
	}
	ids := r.giving
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.s.GiveBack(cctx, r.stream, ids); err != nil {
		r.log.Warn().Err(err).Int("entries", len(ids)).Msg("drain: could not give the entries read ahead back to the group; retrying")
		r.pause(ctx, retryWait)
		return
	}
	r.giving = nil
	r.log.Info().Int("entries", len(ids)).Msg("drain: gave the entries read ahead back to the group")
	if obs, ok := r.s.cfg.Observer.(DrainObserver); ok {
		obs.GaveBack(r.stream, ids)
	}
}

// takeAhead empties the read-ahead and returns the ids it held.
func (r *reader) takeAhead() []string {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	ids := make([]string, 0, len(r.ahead))
	for _, m := range r.ahead {
		ids = append(ids, m.ID)
	}
	r.ahead = nil
	return ids
}

// endGiveBack bounds how long the end of a reader tries to give its read-ahead back.
const endGiveBack = 2 * time.Second

// giveBackAtEnd hands the entries read ahead and never handed over back to the group
// once the reader ends (the subscriber closes, or its Subscribe context ends), with
// those of a drain still to give back when fill is done (withGiving: fill's own), so
// that a worker that stops (a rolling update names its pods anew) leaves them to the
// others' next claim pass rather than for MaxIdleTime. Once fill is done it first takes
// what a read or claim whose reply was lost took (recoverTaken), so those are given
// back too rather than left ours unseen. If it fails for endGiveBack, they wait for
// MaxIdleTime as before (late, not lost).
func (r *reader) giveBackAtEnd(withGiving bool) {
	ctx, cancel := context.WithTimeout(context.Background(), endGiveBack)
	defer cancel()
	if withGiving {
		if err := r.recoverTaken(ctx); err != nil {
			r.log.Warn().Err(err).Msg("at the end, taking the entries of a read or claim whose reply was lost failed; a claim pass takes them after MaxIdleTime")
		}
	}
	ids := r.takeAhead()
	if withGiving {
		ids = append(ids, r.giving...)
		r.giving = nil
	}
	if len(ids) == 0 {
		return
	}
	// Tried a few times within endGiveBack (each try is go-redis's, with its retries):
	// Close promises them back.
	err := r.s.GiveBack(ctx, r.stream, ids)
	for wait := 10 * time.Millisecond; err != nil && r.pause(ctx, wait); wait *= 2 {
		err = r.s.GiveBack(ctx, r.stream, ids)
	}
	if err != nil {
		r.log.Warn().Err(err).Int("entries", len(ids)).Msg("could not give the entries read ahead back at the end; a claim pass takes them after MaxIdleTime")
		return
	}
	r.log.Info().Int("entries", len(ids)).Msg("gave the entries read ahead back to the group at the end")
	if obs, ok := r.s.cfg.Observer.(DrainObserver); ok {
		obs.GaveBack(r.stream, ids)
	}
}
