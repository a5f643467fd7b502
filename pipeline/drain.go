package pipeline

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/drainreq"
)

// Worker drain (docs/operations.md, "Maintenance and upgrades: drain"). With each
// presence beat the router reads the standing drain requests (Topology.Drains, one
// HGETALL) and drains or undrains each subscription a request names
// (subscriber.Subscriber.Drain: it reads and claims nothing, gives its read-ahead back
// to the group, lets the running event finish); the beat reports each subscription's
// state (WorkerBeat.Drain). Run reads the requests once before its subscriptions
// start, so a worker started while a request for it stands starts drained. The lease
// is not touched: an entry given back is pending and idle like one a dead consumer
// left, and the claim veto and the hand-off window (a lease taken ahead for it is
// given back after handoffWindow) apply as for the offer-back.

// drainControl is the router's view of the requests that name its subscriptions.
type drainControl struct {
	mu      sync.Mutex
	reasons map[*subscription]string // drained subscriptions → the request's reason
	failing bool                     // the last read of the requests failed (logged once)
}

// pollDrains reads the standing requests and applies them. A failed read changes
// nothing: a worker keeps its state until Redis answers again.
func (r *Router) pollDrains(ctx context.Context) {
	h, err := r.cfg.Client.HGetAll(ctx, r.cfg.Topology.Drains()).Result()
	r.drains.mu.Lock()
	wasFailing := r.drains.failing
	r.drains.failing = err != nil && !errors.Is(err, redis.Nil)
	r.drains.mu.Unlock()
	if err != nil && !errors.Is(err, redis.Nil) {
		if !wasFailing && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("drain requests not read; each worker keeps its drain state until they are")
		}
		return
	}
	r.applyDrains(drainreq.Decode(h))
}

// applyDrains drains the subscriptions a request names and undrains the others.
func (r *Router) applyDrains(reqs []drainreq.Request) {
	// The most specific request speaks (its reason is shown): worker, agent, all.
	slices.SortFunc(reqs, func(a, b drainreq.Request) int { return specificity(b.Target) - specificity(a.Target) })
	r.drains.mu.Lock()
	defer r.drains.mu.Unlock()
	if r.drains.reasons == nil {
		r.drains.reasons = map[*subscription]string{}
	}
	for _, s := range r.subs {
		i := slices.IndexFunc(reqs, func(q drainreq.Request) bool {
			return q.Target.Matches(r.cfg.Agent, r.cfg.Branch, r.cfg.Consumer, s.consumer)
		})
		_, was := r.drains.reasons[s]
		switch {
		case i >= 0:
			q := reqs[i]
			r.drains.reasons[s] = q.Reason
			if !was {
				s.sub.Drain()
				s.log.Info().Str("target", q.Target.String()).Str("who", q.Who).Str("reason", q.Reason).
					Msg("drain: taking no new work; the running event finishes, entries read ahead go back to the group")
			}
		case was:
			delete(r.drains.reasons, s)
			s.sub.Undrain()
			s.log.Info().Msg("drain undone: taking work again")
		}
	}
}

func specificity(t drainreq.Target) int {
	switch {
	case t.Worker != "":
		return 3
	case t.Branch != "":
		return 2
	case t.Agent != "":
		return 1
	}
	return 0
}

// drainState is s's state for its presence record, and the request's reason.
func (r *Router) drainState(s *subscription) (state, reason string) {
	r.drains.mu.Lock()
	reason, on := r.drains.reasons[s]
	r.drains.mu.Unlock()
	switch {
	case !on:
		return "", ""
	case s.sub.Drained():
		return drainreq.Drained, reason
	}
	return drainreq.Draining, reason
}

// drainSignature sums up every subscription's drain state, so the presence loop beats
// as soon as one changes; pending is true while one is draining, not yet drained.
func (r *Router) drainSignature() (sig string, pending bool) {
	var b strings.Builder
	for _, s := range r.subs {
		st, _ := r.drainState(s)
		b.WriteString(st)
		b.WriteByte(',')
		pending = pending || st == drainreq.Draining
	}
	return b.String(), pending
}

// GaveBack implements subscriber.DrainObserver: the entries a drain gave back are not
// this process's any more (the claim veto no longer spares them, Peek does not name
// them).
func (s *subscription) GaveBack(_ string, ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.inflight, id)
		s.dequeue(id)
	}
}
