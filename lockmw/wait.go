package lockmw

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// MetaWaitedFrom names, on the copy of an event that waited in its key's line (policy
// Wait), the stream entry the event first had: every copy of one event is one member
// of the line (lease.WaitOptions.LineID).
const MetaWaitedFrom = "waited_from"

// lineID is the event's member of the line: the entry it first had.
func lineID(msg *message.Message, entry Entry) string {
	if from := msg.Metadata.Get(MetaWaitedFrom); from != "" {
		return from
	}
	return entry.ID
}

// waitHold is how long a turn outlives its run (lease.WaitOptions.Hold): a crashed
// run's entry is claimed after MaxIdleTime and takes the key once its lease has
// expired (TTL); twice each, so that a claimer that crashes too keeps the turn.
func (m *Middleware) waitHold() time.Duration {
	return 2*m.cfg.Locker.TTL() + 4*m.cfg.MaxIdleTime
}

// waitOptions are the wait policy's acquire options for msg (entry): its copy, as it
// will be appended again when its turn comes, names its line id.
func (m *Middleware) waitOptions(msg *message.Message, raw string, entry Entry) (*lease.WaitOptions, error) {
	lid := lineID(msg, entry)
	m.waitedIn.Store(Entry{Stream: entry.Stream, Group: entry.Group})
	cp := msg.Copy()
	cp.Metadata.Set(MetaWaitedFrom, lid)
	fields, err := m.cfg.Source.Encode(cp)
	if err != nil {
		return nil, err
	}
	return &lease.WaitOptions{Event: lease.QueuedEvent{Stream: entry.Stream, Fields: fields}, LineID: lid,
		Max: m.rule(msg).MaxWaiting, Hold: m.waitHold(),
		Ack: &lease.Entry{Stream: entry.Stream, Group: entry.Group, ID: entry.ID}, Match: m.sameKey(raw)}, nil
}

// sameKey is lease.WaitOptions.Match for an event of issue raw: a stream entry is an
// event of the same agent key under the wait policy when its issue canonicalises to the
// same key and its type waits; its lid is its waited_from, or its own id. With it, a
// hand-over does not pass an earlier event of the key that a worker read but has not
// put in the line yet (read ahead, between read and acquire, or pending on a dead
// consumer): events of one key run in stream order. Nil under a shared scope (the line
// is the shared key's, whose events the agent's stream does not all hold).
func (m *Middleware) sameKey(raw string) func(map[string]any) (string, bool) {
	issue, err := m.cfg.Locker.Canonicalize(raw)
	if err != nil || m.cfg.Scopes.Shared() {
		return nil
	}
	return func(f map[string]any) (string, bool) {
		et, _ := f[event.MetaPrefix+event.MetaEventType].(string)
		if m.policyOf(et) != Wait {
			return "", false
		}
		key, _ := f[event.MetaPrefix+event.MetaIssueKey].(string)
		k, err := m.cfg.Locker.Canonicalize(key)
		if err != nil || k != issue {
			return "", false
		}
		lid, _ := f[event.MetaPrefix+MetaWaitedFrom].(string)
		return lid, true
	}
}

// scanOf is the pending scan a wake of msg's stranded line makes (lease.PendingScan),
// or nil.
func (m *Middleware) scanOf(msg *message.Message, entry Entry, hasEntry bool) *lease.PendingScan {
	if !hasEntry {
		return nil
	}
	raw, err := m.cfg.IssueKey(msg)
	if err != nil {
		return nil
	}
	match := m.sameKey(raw)
	if match == nil {
		return nil
	}
	return &lease.PendingScan{Stream: entry.Stream, Group: entry.Group, Exclude: entry.ID, Match: match}
}

// finishWaiting ends a wait lease whose event is done (lease.Lease.Handoff: it records
// that the event ran, hands the key to the line's head, and acks entry).
func (m *Middleware) finishWaiting(ctx context.Context, le *lease.Lease, entry Entry) error {
	_, err := le.Handoff(ctx, lease.Entry{Stream: entry.Stream, Group: entry.Group, ID: entry.ID}, nil)
	return err
}

// ranAlready settles a copy of an event that ran to its end under the wait policy (a
// redelivery after its worker died between the release and the ack): acked, not run
// again, and not recorded again (its run recorded its outcome).
func (m *Middleware) ranAlready(ctx context.Context, entry Entry, locked *lease.LockedError, log eventLog) error {
	if entry.ID == "" {
		return nil
	}
	pipe := m.cfg.Locker.Client().Pipeline()
	m.ack(ctx, entry)(pipe)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("%w: ack %s, which ran already: %w", redeliver.ErrTransient, entry.ID, err)
	}
	m.cfg.Source.Settle(entry)
	log.issue = locked.Issue
	log.get().Info().Msg("event ran already (a redelivered copy); acked, not run again")
	return nil
}

// wake hands a stranded line's key to its head (lease.LockedError.Stranded: the turn of
// a run that never finished expired while events waited). A failure is only logged:
// the next event for the key finds it stranded again.
func (m *Middleware) wake(ctx context.Context, locked *lease.LockedError, scan *lease.PendingScan, log eventLog) {
	issue := locked.Issue
	var lid string
	var err error
	if locked.Line.Scope != "" {
		// The line is the shared key's (scope issue or group).
		lid, err = m.cfg.Locker.WakeSharedLine(ctx, locked.Line, 0, m.waitHold())
	} else {
		lid, err = m.cfg.Locker.WakeLineBefore(ctx, m.cfg.Agent, issue, 0, m.waitHold(), scan)
	}
	log.issue = issue
	if err != nil {
		log.get().Warn().Err(err).Msg("could not wake the key's line; the next event for the key tries again")
		return
	}
	if lid != "" {
		log.get().Warn().Str("woke", lid).Msg("the key's line had lost its wake-up (a run that never finished); its head was handed the key")
	}
}

// Waits reports whether a rule of the middleware is Wait: its agent's keys may have
// lines, which RunLineWaker keeps moving.
func (m *Middleware) Waits() bool { return m.lines }

// RunLineWaker wakes, every interval until ctx ends, the lines of the agent that lost
// their wake-up (a run that never finished and never came back: its turn expired with
// events waiting and no further event for the key). Any worker may run it; a wake is
// safe from anyone at any time (lease.Locker.WakeLine). Errors are logged.
func (m *Middleware) RunLineWaker(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sw, err := m.sweepLines(ctx)
		if err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn().Err(err).Str("agent", m.cfg.Agent).Msg("line waker: sweep failed; the next one tries again")
			continue
		}
		if lo, ok := m.cfg.Locker.Observer().(LineObserver); ok {
			lo.Lines(m.cfg.Agent, sw.Lines, sw.Waiting, sw.Longest)
		}
		if len(sw.Woken) > 0 {
			m.cfg.Logger.Warn().Strs("woke", sw.Woken).Str("agent", m.cfg.Agent).
				Msg("line waker: woke lines whose turn expired (a run that never finished)")
		}
	}
}

// LineObserver is implemented by a lease.Observer that also wants the agent's lines, as
// each sweep of RunLineWaker finds them: how many keys have a line, how many events
// wait in them, and the longest line's length.
type LineObserver interface {
	Lines(agent string, lines int, waiting, longest int64)
}

// sweepLines is one sweep of RunLineWaker: the lines of the agent's own keys, or, under
// a shared scope, those of the shared keys (where its events wait, beside other
// agents' or issues'; every worker of the scope sweeps them, which is safe).
func (m *Middleware) sweepLines(ctx context.Context) (lease.LineSweep, error) {
	switch {
	case m.cfg.Scopes.Issue:
		return m.cfg.Locker.WakeSharedLines(ctx, lease.ScopeIssue, m.waitHold())
	case len(m.cfg.Scopes.Group) > 0:
		return m.cfg.Locker.WakeSharedLines(ctx, lease.ScopeGroup, m.waitHold())
	}
	return m.cfg.Locker.WakeLinesBefore(ctx, m.cfg.Agent, m.waitHold(), m.sweepScan)
}

// sweepScan is the pending scan of the line waker's wake of issue's line: the stream
// and group of the last event that waited (the agent's own), or, before any, those its
// Source reads (Origin). Without a scan a freshly started worker's waker handed the key
// to the line's head past an earlier event pending on a dead consumer.
func (m *Middleware) sweepScan(issue string) *lease.PendingScan {
	e, _ := m.waitedIn.Load().(Entry)
	if o, ok := m.cfg.Source.(Origin); ok && e.Stream == "" {
		e.Stream, e.Group = o.Origin()
	}
	match := m.sameKey(issue)
	if e.Stream == "" || match == nil {
		return nil
	}
	return &lease.PendingScan{Stream: e.Stream, Group: e.Group, Match: match}
}
