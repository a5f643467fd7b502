package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/drainreq"
)

// Worker drain (docs/operations.md, "Maintenance and upgrades: drain"): the operator's
// requests in Topology.Drains (DrainRequest), which every worker reads with its
// presence beat; each worker reports draining, then drained, in its presence record.

// DrainTarget names the workers a drain is for: every worker (All), those of an agent
// (Agent, and Branch if set), or one worker by its consumer name (Worker).
type DrainTarget = drainreq.Target

// DrainRequest is one standing drain request: its target, who asked, why and when.
type DrainRequest = drainreq.Request

// ErrNoDrain is returned when an undrain names a target no drain request stands for.
var ErrNoDrain = errors.New("no drain request stands for this target")

// DrainStatus is one standing drain request and the live workers (subscriptions) it
// names, with how many of them report drained.
type DrainStatus struct {
	Request DrainRequest `json:"request"`
	Workers []Worker     `json:"workers"`
	Drained int          `json:"drained"`
}

// Done reports whether every live worker the request names reports drained (true
// when it names none: nothing of it runs).
func (s DrainStatus) Done() bool { return s.Drained == len(s.Workers) }

// Drain asks the workers of t to drain (DrainTarget), recorded in the audit
// trail (action drain, scope t) before the request is written; a second request for
// the same target replaces the first (its reason).
//
// Cost: one round trip after the audit record's.
func (in *Inspector) Drain(ctx context.Context, t DrainTarget) error {
	if err := t.Check(); err != nil {
		return err
	}
	return in.write(ctx, "drain", t.String(), nil, func(ctx context.Context) error {
		op := audit.OperatorFrom(ctx)
		req := DrainRequest{Target: t, Who: op.Who, Reason: op.Reason, At: in.now()}
		if err := in.rdb.HSet(ctx, in.topo.Drains(), t.Field(), req.Encode()).Err(); err != nil {
			return fmt.Errorf("hset %s: %w", in.topo.Drains(), err)
		}
		return nil
	})
}

// Undrain withdraws the drain request for t (the same target as Drain's), recorded in
// the audit trail (action undrain) first: its workers take work again at their next
// beat. ErrNoDrain when none stands (the record then says failed).
//
// Cost: one round trip after the audit record's.
func (in *Inspector) Undrain(ctx context.Context, t DrainTarget) error {
	if err := t.Check(); err != nil {
		return err
	}
	return in.write(ctx, "undrain", t.String(), nil, func(ctx context.Context) error {
		n, err := in.rdb.HDel(ctx, in.topo.Drains(), t.Field()).Result()
		if err != nil {
			return fmt.Errorf("hdel %s: %w", in.topo.Drains(), err)
		}
		if n == 0 {
			return fmt.Errorf("%w (%s)", ErrNoDrain, t)
		}
		return nil
	})
}

// Drains lists the standing drain requests, each with the live workers it names and
// how many report drained, ordered by target.
//
// Cost: one round trip (HGETALL, TIME and the presence set pipelined).
func (in *Inspector) Drains(ctx context.Context) ([]DrainStatus, error) {
	pipe := in.rdb.Pipeline()
	reqs := pipe.HGetAll(ctx, in.topo.Drains())
	read := in.queuePresence(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("drain requests: %w", err)
	}
	p, err := read()
	if err != nil {
		return nil, err
	}
	var out []DrainStatus
	for _, r := range drainreq.Decode(reqs.Val()) {
		out = append(out, drainStatus(r, p))
	}
	slices.SortFunc(out, func(a, b DrainStatus) int {
		return strings.Compare(a.Request.Target.Field(), b.Request.Target.Field())
	})
	return out, nil
}

// DrainProgress is the status of a drain of t, as `drain --wait` polls it: the live
// workers t names and how many report drained, whether or not a request for t stands
// (Request is zero when none does).
//
// Cost: one round trip.
func (in *Inspector) DrainProgress(ctx context.Context, t DrainTarget) (DrainStatus, error) {
	all, err := in.Drains(ctx)
	if err != nil {
		return DrainStatus{}, err
	}
	for _, s := range all {
		if s.Request.Target == t {
			return s, nil
		}
	}
	ws, err := in.Workers(ctx)
	if err != nil {
		return DrainStatus{}, err
	}
	p := presence{workers: map[workerRef]Worker{}}
	for _, w := range ws {
		p.workers[workerRef{w.Stream, w.Group, w.Consumer}] = w
	}
	s := drainStatus(DrainRequest{Target: t}, p)
	s.Request = DrainRequest{}
	return s, nil
}

// drainStatus finds the live workers r names in p.
func drainStatus(r DrainRequest, p presence) DrainStatus {
	s := DrainStatus{Request: r, Workers: []Worker{}}
	for _, w := range p.workers {
		if !w.Alive || !r.Target.Matches(w.Agent, w.Branch, BaseConsumer(w.Consumer), w.Consumer) {
			continue
		}
		s.Workers = append(s.Workers, w)
		if w.Drain == drainreq.Drained {
			s.Drained++
		}
	}
	sortWorkers(s.Workers)
	return s
}

// BaseConsumer is the process's consumer name of a subscription's ("w1" of "w1-0").
func BaseConsumer(consumer string) string {
	if i := strings.LastIndexByte(consumer, '-'); i > 0 {
		return consumer[:i]
	}
	return consumer
}
