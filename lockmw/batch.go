package lockmw

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Batched ends. An event's cost is mostly its round trip: the Redis server and the
// worker each spend more on sending and reading one script than on what it does. While
// runs are quick (each under batchQuick), the end of a run whose next entry already
// has its lease (taken ahead), or that has no next entry read yet, waits: it is
// released and its entry acked with the next batch, in one script that also takes the
// leases of up to batchAhead entries read ahead (lease.Locker.HandoffBatch). A burst of
// quick events then costs one round trip per batch. A batch is sent when the next
// entry has no lease taken ahead, when batchEnds ends wait, or batchFlushAfter after
// the first end waited, whichever comes first; an entry that must take its own lease
// first sends the ends that wait (or waits for a batch in flight), so it never meets a
// lease of a run that has ended. A release is dated by when its run ended
// (lease.End.EndedAt), so waiting changes no superseded verdict.

const (
	// batchQuick: a run shorter than this lets its end wait for the batch, and takes
	// up to batchAhead leases ahead; a longer one takes one, as before batching.
	batchQuick = 2 * time.Millisecond
	// batchAhead is the most leases one batch takes ahead.
	batchAhead = 32
	// batchEnds is the most ends that wait for a batch.
	batchEnds = 64
	// batchFlushAfter is the longest an end waits for its batch.
	batchFlushAfter = time.Millisecond
)

// batch holds the ends that wait to be sent, and sends them.
type batch struct {
	mu    sync.Mutex
	ends  []lease.End
	timer *time.Timer // sends the waiting ends batchFlushAfter after the first
	armed bool
	// sending is held while a batch is sent: batches reach Redis in the order of their
	// ends, so a lease is never taken ahead before an earlier run's release.
	sending sync.Mutex
	// flying: the ends that take returned are being sent (until landed). An entry
	// that takes its own lease waits for them as for ends that wait (unsent): the
	// timer's batch may be in flight when it comes.
	flying bool
	// life ends when the middleware is closed: the timer's retries stop then.
	life context.Context
	end  context.CancelFunc
}

// wait adds e to the ends that wait, unless batchEnds wait already; flush sends them
// after at most after.
func (b *batch) wait(e lease.End, after time.Duration, flush func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.ends) >= batchEnds {
		return false
	}
	b.ends = append(b.ends, e)
	if !b.armed {
		if b.timer == nil {
			b.timer = time.AfterFunc(after, flush)
		} else {
			b.timer.Reset(after)
		}
		b.armed = true
	}
	return true
}

// take returns the ends that wait and forgets them; they fly until landed. Call it
// with sending held.
func (b *batch) take() []lease.End {
	b.mu.Lock()
	defer b.mu.Unlock()
	ends := b.ends
	b.ends, b.armed, b.flying = nil, false, len(ends) > 0
	return ends
}

// landed: the ends that take returned have been sent (or their send failed). Call it
// with sending held.
func (b *batch) landed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flying = false
}

// unsent reports whether ends wait, or are being sent.
func (b *batch) unsent() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ends) > 0 || b.flying
}

// close sends the ends that wait (the router has stopped), stops the timer and ends
// the timer's retries.
func (b *batch) close(ctx context.Context, m *Middleware) {
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	m.sendWaiting(ctx, nil)
	b.end()
}

// batches reports whether le's run ends through a batch: the middleware batches, and
// le can be released in a batch (standalone Redis, its own key alone).
func (m *Middleware) batches(le *lease.Lease) bool {
	return m.batching && le.Batchable()
}

// endInBatch is finishRan for a lease that batches: the end waits for the batch when
// the run was quick and the next entry's lease is taken already; otherwise the batch
// is sent now, with this end last, taking the leases of the entries that come next.
func (m *Middleware) endInBatch(d *delivery, le *lease.Lease, out []*message.Message) ([]*message.Message, error) {
	end := lease.End{Lease: le, Entry: lease.Entry{Stream: d.entry.Stream, Group: d.entry.Group, ID: d.entry.ID}, EndedAt: time.Now()}
	quick := d.ranFor < m.quick
	if quick && m.nextTaken(d.entry) && m.batch.wait(end, m.flushAfter, m.sendWaitingLater) {
		// The entry is acked with its release, in the batch: the subscriber sends no
		// XACK of its own. Its context ends with the ack: the lease, released later,
		// is untied from it first.
		le.Unbind()
		m.cfg.Source.Settle(d.entry)
		return out, nil
	}
	n := 1
	if quick {
		n = batchAhead
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), 5*time.Second)
	defer cancel()
	ends, ps, issues, err := m.sendTaken(ctx, []lease.End{end}, func() ([]lease.Next, []string) {
		return m.aheadOf(d.entry, n)
	})
	m.keepAhead(ps, issues)
	if err == nil {
		m.cfg.Source.Settle(d.entry)
		m.logRequeued(ends)
		return out, nil
	}
	if err := m.endLater(d.ctx, ends, err, d.log); err != nil {
		return nil, err
	}
	m.cfg.Source.Settle(d.entry)
	return out, nil
}

// nextTaken reports whether the entry handed over after cur has its lease taken ahead,
// or none is read ahead: the next entry read then takes its lease with the ends that
// wait (sendWithEntry), or the timer sends them.
func (m *Middleware) nextTaken(cur Entry) bool {
	id, _, ok := m.peeker.Peek()
	return !ok || (id != cur.ID && m.handoffs.has(id))
}

// aheadOf names the leases to take ahead for the entries read after cur, up to n, in
// their order, with their canonical issues: never an entry that has one already, nor a
// bad event (it is dead-lettered, lockless), and none from the first entry whose issue
// is one that a lease taken ahead, an earlier entry of the batch, or curIssue (cur's,
// when its lease is taken in the same batch) holds: its lease must come after that
// one's release.
func (m *Middleware) aheadOf(cur Entry, n int, curIssue ...string) ([]lease.Next, []string) {
	if _, _, ok := m.peeker.Peek(); !ok {
		return nil, nil // nothing read ahead, or the subscription is drained
	}
	ids, held := m.handoffs.issues()
	for _, issue := range curIssue {
		held[issue] = true // the entry that takes its lease in the same batch
	}
	var nexts []lease.Next
	var issues []string
	for _, q := range m.waiter.Waiting() {
		if q.ID == cur.ID || ids[q.ID] {
			continue
		}
		issue, err := m.cfg.Locker.Canonicalize(q.IssueKey)
		if err != nil {
			continue
		}
		if held[issue] || len(nexts) == n {
			break
		}
		held[issue] = true
		nexts = append(nexts, m.nextFor(cur, q.ID, q.IssueKey))
		issues = append(issues, issue)
	}
	return nexts, issues
}

// keepAhead keeps the leases a batch took ahead for their entries (keep).
func (m *Middleware) keepAhead(ps []*lease.Pending, issues []string) {
	kept := make([]ahead, 0, len(ps))
	for i, p := range ps {
		if keep(p) {
			kept = append(kept, ahead{p: p, issue: issues[i]})
		}
	}
	if len(kept) > 0 {
		m.handoffs.put(kept...)
	}
}

// sendTaken is every batch's send, with sending held (batches reach Redis in the order
// of their ends): the ends that wait, then last, and the leases that ahead names (nil:
// none), named with sending held so that they see the leases every earlier batch took.
// Nothing is sent when there is nothing to send. It returns the ends sent, one Pending
// per lease taken ahead and their issues.
func (m *Middleware) sendTaken(ctx context.Context, last []lease.End, ahead func() ([]lease.Next, []string)) ([]lease.End, []*lease.Pending, []string, error) {
	m.batch.sending.Lock()
	defer m.batch.sending.Unlock()
	defer m.batch.landed()
	ends := append(m.batch.take(), last...)
	var nexts []lease.Next
	var issues []string
	if ahead != nil {
		nexts, issues = ahead()
	}
	if len(ends) == 0 && len(nexts) == 0 {
		return nil, nil, nil, nil
	}
	ps, err := m.sendBatch(ctx, ends, nexts)
	return ends, ps, issues, err
}

// sendWaiting sends the ends that wait, if any, alone: the timer's batch, an entry's
// that must take its own lease, and Close's. It returns once a batch in flight has
// landed too. A failure is retried (endLater) until retry ends; with retry nil (Close:
// the worker stops) it is not, and the entries stay pending, their leases expiring by
// their TTL.
func (m *Middleware) sendWaiting(ctx, retry context.Context) {
	if !m.batch.unsent() {
		return
	}
	ends, _, _, err := m.sendTaken(ctx, nil, nil)
	if err != nil {
		log := eventLog{base: &m.cfg.Logger, agent: m.cfg.Agent}
		if retry == nil {
			log.get().Warn().Err(err).Int("runs", len(ends)).Msg("stopping: batched release failed; entries left pending, leases expire by their TTL")
			return
		}
		_ = m.endLater(retry, ends, err, log)
		return
	}
	m.logRequeued(ends)
}

// sendWithEntry sends the ends that wait, if any, before d's entry takes its lease:
// in the same batch it takes that lease and those of the entries after it, and
// returns the first (nil when it took none: the entry acquires on its own). Ends that
// another batch is sending (the timer's) are waited for: the entry's acquire must
// not overtake their releases.
func (m *Middleware) sendWithEntry(d *delivery, raw string) *lease.Pending {
	if !m.batch.unsent() {
		return nil
	}
	ctx := context.WithoutCancel(d.ctx)
	issue, err := m.cfg.Locker.Canonicalize(raw)
	if !d.hasEntry || !m.takeAhead || err != nil {
		m.sendWaiting(ctx, d.ctx)
		return nil
	}
	ends, ps, issues, err := m.sendTaken(ctx, nil, func() ([]lease.Next, []string) {
		nexts, issues := m.aheadOf(d.entry, batchAhead-1, issue)
		return append([]lease.Next{m.nextFor(d.entry, d.entry.ID, raw)}, nexts...), append([]string{issue}, issues...)
	})
	if err != nil {
		if len(ends) > 0 {
			_ = m.endLater(d.ctx, ends, err, d.log)
		}
		return nil
	}
	m.logRequeued(ends)
	m.keepAhead(ps[1:], issues[1:])
	return ps[0]
}

// sendWaitingLater is the timer's: the ends that waited batchFlushAfter are sent,
// retried until they are or the middleware is closed.
func (m *Middleware) sendWaitingLater() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.sendWaiting(ctx, m.batch.life)
}

// logRequeued logs the follow-ups that the releases of ends published.
func (m *Middleware) logRequeued(ends []lease.End) {
	for _, e := range ends {
		if id := e.Lease.Requeued(); id != "" {
			m.cfg.Logger.Info().Str("agent", m.cfg.Agent).Str("issue_key", e.Lease.Issue()).Str("message_id", e.Entry.ID).
				Str("requeued_id", id).Msg("published the issue's queued follow-up")
		}
	}
}

// errGaveUp: the releases of a batch failed for a whole lease TTL; the keys have
// expired by themselves.
var errGaveUp = errors.New("lockmw: batch not sent for a whole lease TTL")

// endLater retries a batch's releases and acks whose round trip failed (Redis
// unreachable), as releaseLater does for one: every second at most, for up to the
// lease TTL. Past it the keys have expired on their own and the entries are acked
// alone. The ends that waited were settled with the source already. It returns an error (the entries stay pending) only when ctx ends first.
func (m *Middleware) endLater(ctx context.Context, ends []lease.End, first error, log eventLog) error {
	log.get().Warn().Err(first).Int("runs", len(ends)).Msg("batched release failed; retrying it before the entries are acked")
	expired, err := m.retryEnd(ctx, first, func(rctx context.Context) bool {
		_, err := m.sendBatch(rctx, ends, nil)
		return err == nil
	})
	switch {
	case err != nil:
		log.get().Warn().Int("runs", len(ends)).Msg("shutting down before the batched release succeeded; entries left pending")
		return err
	case !expired:
		log.get().Info().Int("runs", len(ends)).Msg("released and acked after retrying")
		return nil
	}
	log.get().Warn().Err(errGaveUp).Dur("ttl", m.cfg.Locker.TTL()).Msg("the leases have expired by now; acking the entries alone")
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	pipe := m.cfg.Locker.Client().Pipeline()
	for _, e := range ends {
		pipe.XAck(rctx, e.Entry.Stream, e.Entry.Group, e.Entry.ID)
	}
	if _, err := pipe.Exec(rctx); err != nil && !errors.Is(err, redis.Nil) {
		log.get().Warn().Err(err).Msg("acks failed; the entries stay pending and are claimed again")
	}
	return nil
}
