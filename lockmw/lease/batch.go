package lease

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// The batched hand-off: while runs are short, the round trip of every event's end is
// the cost of an event (its Redis server time and its worker's CPU are mostly the
// round trip's). HandoffBatch ends several runs and takes the leases of several next
// entries in one script and one round trip, so that a burst of quick events costs one
// round trip per batch instead of one per event.

//go:embed scripts/handoff_batch.lua
var handoffBatchLua string

var handoffBatchScript = newScript(xonce.IndexLua, leaseSteps, handoffBatchLua)

// maxBatchAgo bounds how far back a batch dates a release (End.EndedAt): a run that
// ended longer ago than this is dated this far back, never earlier.
const maxBatchAgo = time.Second

// End is a finished run that HandoffBatch releases (outcome ran) and whose stream entry
// it acks.
type End struct {
	Lease *Lease
	// Entry is the stream entry the lease was taken for.
	Entry Entry
	// EndedAt is when the run ended, on the worker's monotonic clock: its release is
	// dated by the server's clock minus the time since then, so that an event that
	// entered its stream after the run ended does not count as superseded by it.
	EndedAt time.Time
}

// Batchable reports whether the lease can end in a HandoffBatch: standalone Redis
// (KeysCluster puts each lease in a hash slot of its own), and a lease of its own key
// alone, with no line, no slots and no draining of follow-ups.
func (le *Lease) Batchable() bool {
	return le.l.opts.Format != KeysCluster && le.line == nil && le.slots == nil && !le.drain && len(le.shared) == 0
}

// errNotBatchable refuses an End whose lease cannot end in a batch (Lease.Batchable).
var errNotBatchable = errors.New("lease: HandoffBatch: a lease that is not Batchable")

// HandoffBatch ends runs and takes leases ahead in one script and one round trip: for
// each End in order, the lease's release (outcome ran, publishing its queued follow-up
// if any), then the XACK of its entry; then, for each Next in order, its lease taken
// ahead, as Lease.Handoff takes one. Every lease must be Batchable, and a Next must not
// queue or hold shared keys. It returns one Pending per Next, in order. A Next with
// Pauses has its pause check made in the same script, after its acquire
// (Pending.PauseChecked).
//
// A lease whose key was no longer its own when its release ran (taken over, or
// expired and taken) tells a newer holder it stopped, as Handoff does. On a Redis
// error nothing is known to have happened: every Pending carries the error, and the
// batch is safe to send again (a release finds its key gone, an acquire its own token).
func (l *Locker) HandoffBatch(ctx context.Context, ends []End, next []Next) ([]*Pending, error) {
	for _, e := range ends {
		if !e.Lease.Batchable() {
			return nil, errNotBatchable
		}
	}
	pending := make([]*Pending, len(next))
	acqs := make([]*acquisition, 0, len(next))
	for i := range next {
		a, err := l.prepareNext(&next[i])
		pending[i] = &Pending{id: next[i].Options.MessageID, err: err}
		if err == nil {
			acqs = append(acqs, a)
		}
	}
	args, nkeys := l.batchArgs(ends, acqs, l.batchPauses(next, pending))
	first := make([]bool, len(ends))
	for i, e := range ends {
		le := e.Lease
		le.stopHeartbeat()
		// Counted once: a repeat, or a loss first, finds the end taken. A run whose end
		// waited for its batch untied its lease from its message's context (Unbind).
		first[i] = le.endOnce()
		le.cancel(ErrReleased)
	}
	res, err := runScript(ctx, l.rdb, handoffBatchScript, nkeys, args).Slice()
	for i, e := range ends {
		if first[i] {
			l.opts.Observer.Released(e.Lease.agent, e.EndedAt.Sub(e.Lease.acquiredAt))
		}
	}
	if err == nil {
		err = l.endBatch(ctx, ends, res)
	}
	if err != nil {
		err = fmt.Errorf("lease: handoff of %d runs: %w", len(ends), err)
		for _, p := range pending {
			if p.err == nil {
				p.err = err
			}
		}
		return pending, err
	}
	l.takenAhead(pending, acqs, res[3*len(ends):])
	return pending, nil
}

// batchPause is the pause check a batch makes for its nexts (handoff_batch.lua): the
// keys of the pauses, and per next (whose preparation succeeded, in order) the field
// of its entry in seen, or "" for none.
type batchPause struct {
	keys   *PauseKeys
	fields []string
}

// batchPauses is the pause check of a batch: the nexts with Pauses whose keys are
// the first such next's (one registry per batch), on standalone Redis only (on
// Cluster the pause keys are in a hash slot of their own; batches run standalone).
func (l *Locker) batchPauses(next []Next, pending []*Pending) batchPause {
	var bp batchPause
	for i, n := range next {
		if pending[i].err != nil {
			continue
		}
		f := ""
		if n.Pauses != nil && l.opts.Format != KeysCluster && n.Pauses.l.opts.Format != KeysCluster && n.Stream != "" {
			if bp.keys == nil {
				bp.keys = &n.Pauses.keys
			}
			if n.Pauses.keys == *bp.keys {
				f = n.Stream + " " + n.Options.MessageID
			}
		}
		bp.fields = append(bp.fields, f)
	}
	return bp
}

// batchArgs lays out handoff_batch.lua's KEYS and ARGV (see the script).
func (l *Locker) batchArgs(ends []End, acqs []*acquisition, bp batchPause) ([]any, int) {
	nkeys := 6*len(ends) + kvKeys*len(acqs)
	if bp.keys != nil {
		nkeys += 2
	}
	args := scriptArgs(nkeys + 4 + 7*len(ends) + 7*len(acqs))
	for _, e := range ends {
		le := e.Lease
		args = append(args, &le.keys.Lock, &le.keys.Info, &le.keys.Done, &le.keys.Queue, &le.keys.Mailbox, e.Entry.Stream)
	}
	for _, a := range acqs {
		args = append(args, a.kv[:kvKeys]...)
	}
	if bp.keys != nil {
		args = append(args, bp.keys.Reg, bp.keys.Seen)
	}
	args = append(args, len(ends), len(acqs), &indexMax, &indexTTLms)
	for _, e := range ends {
		le := e.Lease
		ago := min(max(time.Since(e.EndedAt), 0), maxBatchAgo).Milliseconds()
		args = append(args, &le.token, &le.entry, e.Entry.Group, e.Entry.ID, &le.maxLen, &le.issue, ago)
	}
	for i, a := range acqs {
		args = append(args, a.kv[kvKeys:]...)
		args = append(args, bp.fields[i])
	}
	return args, nkeys
}

// endBatch reads the ends' part of a batch's reply: the leases whose keys were no
// longer their own tell their newer holders they stopped (one pipeline for all), and a
// published follow-up is noted.
func (l *Locker) endBatch(ctx context.Context, ends []End, res []any) error {
	if len(res) < 3*len(ends) {
		return fmt.Errorf("unexpected reply %v", res)
	}
	var pipe redis.Pipeliner
	for i, e := range ends {
		le := e.Lease
		if atoi(res[3*i]) != 1 {
			if pipe == nil {
				pipe = l.rdb.Pipeline()
			}
			pipe.HDel(ctx, le.keys.Stop, le.token) // as Lease.stopped
		}
		if id, _ := res[3*i+2].(string); id != "" {
			le.requeued.Store(id)
		}
	}
	if pipe != nil {
		if _, err := pipe.Exec(ctx); err != nil {
			l.opts.Logger.Warn().Err(err).Msg("could not tell newer holders that batched runs stopped; they wait for those leases' expiry")
		}
	}
	return nil
}

// takenAhead reads the nexts' part of a batch's reply into their Pendings (those whose
// preparation failed keep their error).
func (l *Locker) takenAhead(pending []*Pending, acqs []*acquisition, res []any) {
	j := 0
	for _, p := range pending {
		if p.err != nil {
			continue
		}
		a := acqs[j]
		j++
		if len(res) == 0 {
			p.err = fmt.Errorf("lease: acquire %s: reply cut short", a.keys.Lock)
			continue
		}
		n := int(atoi(res[0]))
		if n+2 > len(res) {
			p.err = fmt.Errorf("lease: acquire %s: reply cut short", a.keys.Lock)
			res = nil
			continue
		}
		p.lease, p.err = a.finish(context.Background(), res[1:1+n], nil)
		p.checked = p.err == nil && atoi(res[1+n]) == 1
		res = res[2+n:]
	}
}
