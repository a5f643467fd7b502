package lockmw

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Conflict is an event the middleware did not run because its issue was busy.
type Conflict struct {
	Agent string
	// Issue is the event's canonical issue (Holder.Issue may be another one when a
	// shared group key was busy).
	Issue   string
	Message *message.Message
	// Entry is the event's stream entry (zero without a Source).
	Entry Entry
	// Holder is the lease's holder; for a superseded event, the run that superseded it
	// (Issue and MessageID only).
	Holder lease.Info
	// Superseded: the event entered its stream before another event's run of the issue
	// ended (it waited in a read-ahead buffer), rather than meeting a live holder.
	Superseded bool
	// Queued: the event was kept as the issue's follow-up (policy Coalesce); Replaced:
	// it replaced an older queued one.
	Queued, Replaced bool
	// Delayed: the event was re-queued (policy Delay), to be appended to its stream
	// again at Until; Delays counts its delays so far, this one included.
	Delayed bool
	Until   time.Time
	Delays  int
	// Delivered: the event was appended to the holder's mailbox (policy Deliver) as
	// MailboxID (empty for a repeat whose first try appended it).
	Delivered bool
	MailboxID string
	// Waited: the event joined its key's line (policy Wait) at Position (1 the head;
	// OldestAt, when the head joined); it runs when a release hands the key to it.
	Waited   bool
	Position int64
	OldestAt time.Time
	// Policy is the event's busy policy. Under Supersede, a Superseded event lost to a
	// newer one: Holder names it (MessageID, and Fence when known). Cancelled: the
	// event held the lease and was taken over by the newer event (its run, Ran, or its
	// wait for an older run to stop, was cancelled).
	Policy         Policy
	Cancelled, Ran bool
}

// ConflictRecorder queues the record of a conflict on pipe (an XADD to a results
// stream, say). The middleware sends it in the round trip that acks the event's entry,
// and leaves the entry pending if that round trip fails. It must not read replies.
type ConflictRecorder func(ctx context.Context, pipe redis.Pipeliner, c Conflict)

// conflict handles an event whose issue is held by someone else (superseded: whose
// issue was worked on while it waited; locked then names that run), in steps: (1) a
// copy of the live holder's own entry is left alone; (2) the Conflict, the event's
// end, is made; (3) under policy Delay its re-queue is prepared; (4) its record and
// the ack are written, record first (recordAndAck); (5) it is counted and logged.
func (m *Middleware) conflict(ctx context.Context, msg *message.Message, entry Entry, hasEntry bool, locked *lease.LockedError, superseded bool, ev eventLog) error {
	holder := locked.Holder
	issue := locked.Issue
	if issue == "" {
		issue = holder.Issue
	}
	ev.issue = issue
	// The lease says whether it is the holder's own entry (LockedError.Own), not the
	// holder's record: a key the line reserved for an event names the event's first
	// entry, which a stale copy of it, refused as one, may be.
	if hasEntry && locked.Own && !superseded {
		// A redelivered copy of the entry a live holder is working on (claimed while the
		// holder's heartbeat could not refresh it). Acking it would lose the holder's
		// crash recovery; running it would run it twice. The holder's next heartbeat
		// takes the entry back.
		conflictLog(ev, holder).Warn().Msg("entry is the live holder's in-flight entry; neither running nor acking it")
		m.cfg.Source.Settle(entry)
		return nil
	}
	rule := m.rule(msg)
	if rule.Policy == Supersede && locked.Newer {
		// The holder's event is newer (a redelivered or retried older event): it lost.
		superseded = true
	}
	c := Conflict{Agent: m.cfg.Agent, Issue: issue, Message: msg, Entry: entry, Holder: holder, Superseded: superseded,
		Queued: locked.Queued, Replaced: locked.Replaced, Delivered: locked.Delivered, MailboxID: locked.MailboxID, Policy: rule.Policy,
		Waited: locked.Waited || (locked.Duplicate && rule.Policy == Wait), Position: locked.Position, OldestAt: locked.OldestAt}
	var delayed string // the delayed set's member, policy Delay
	if hasEntry && rule.Policy == Delay && !locked.Queued && !locked.Delivered {
		var err error
		if delayed, err = m.delay(ctx, msg, entry, rule, &c); err != nil {
			return err
		}
	}
	if m.cfg.OnConflict != nil || hasEntry {
		// No busy script acks the entry: this does, after the record.
		err := m.recordAndAck(ctx, c, hasEntry, func(pipe redis.Pipeliner) {
			if delayed != "" {
				// Kept before the ack: a crash between them leaves the entry pending, and its
				// redelivery adds the same member again (one member per event). NX: a second
				// delay of the entry (a redelivery, a consumer that claimed it meanwhile)
				// keeps the first one's time, the one its record (written once) gives.
				pipe.ZAddNX(ctx, delayq.Key(entry.Stream), redis.Z{Score: float64(c.Until.UnixMilli()), Member: delayed})
			}
		})
		if err != nil {
			return fmt.Errorf("%w: record the conflict on %s: %w", redeliver.ErrTransient, issue, err)
		}
	}
	if hasEntry {
		m.cfg.Source.Settle(entry)
	}
	m.conflicted(ctx, c, locked.Depth, ev)
	return nil
}

// recordAndAck writes c's record (Config.OnConflict, after first's commands) and, when
// ack is set, the XACK of its entry, the record first. On standalone Redis one
// pipeline keeps that order (one connection, run in order); a Cluster pipeline sends
// each node its commands concurrently, so there the ack is a second round trip after
// the record succeeded. A crash in between leaves the entry pending; its redelivery
// records nothing twice if the recorder is idempotent per entry (the pipeline's is).
func (m *Middleware) recordAndAck(ctx context.Context, c Conflict, ack bool, first func(redis.Pipeliner)) error {
	pipe := m.cfg.Locker.Client().Pipeline()
	first(pipe)
	if m.cfg.OnConflict != nil {
		m.cfg.OnConflict(ctx, pipe, c)
	}
	ackLater := ack && m.cfg.Locker.Format() == lease.KeysCluster && pipe.Len() > 0
	if ack && !ackLater {
		pipe.XAck(ctx, c.Entry.Stream, c.Entry.Group, c.Entry.ID)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if ackLater {
		pipe = m.cfg.Locker.Client().Pipeline()
		m.ack(ctx, c.Entry)(pipe)
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	return nil
}

// outcome is how the event of a Conflict ended, and why: outcome "dropped",
// "coalesced", "delayed", "delivered", "waited" or "superseded"; reason "locked",
// "superseded" or, for a run a newer event took over, "cancelled". It is what the
// Observer counts and the trace records.
func (c Conflict) outcome() (outcome, reason string) {
	outcome, reason = "dropped", "locked"
	switch {
	case c.Cancelled:
		return "superseded", "cancelled"
	case c.Waited:
		outcome = "waited"
	case c.Delivered:
		outcome = "delivered"
	case c.Queued:
		outcome = "coalesced"
	case c.Delayed:
		outcome = "delayed"
	case c.Superseded && c.Policy == Supersede:
		outcome = "superseded"
	}
	if c.Superseded {
		reason = "superseded"
	}
	return outcome, reason
}

// conflicted counts, traces and logs the end of c's event (depth: the mailbox's, for a
// delivered follow-up; a waiting event is logged with its position and the line's
// oldest).
func (m *Middleware) conflicted(ctx context.Context, c Conflict, depth int64, ev eventLog) {
	outcome, reason := c.outcome()
	m.cfg.Locker.Observer().Conflict(m.cfg.Agent, outcome, reason)
	leaseConflict(ctx, outcome, reason, c.Holder)
	log := conflictLog(ev, c.Holder)
	switch {
	case c.Cancelled:
		ev.get().Info().Str("superseded_by", c.Holder.MessageID).Int64("new_fence", c.Holder.Fence).Bool("ran", c.Ran).
			Msg("a newer event took the issue over; this run was cancelled, recorded and acked")
	case c.Waited:
		log.Info().Int64("position", c.Position).Time("oldest_waiting_since", c.OldestAt).
			Msg("issue is locked; event waits in the key's line")
	case c.Delivered:
		log.Info().Str("mailbox_id", c.MailboxID).Int64("mailbox_depth", depth).
			Msg("issue is locked; event delivered to the holder's mailbox")
	case c.Queued:
		log.Info().Bool("replaced", c.Replaced).Msg("issue is locked; event queued as its follow-up")
	case c.Delayed:
		log.Info().Str("reason", reason).Time("delayed_until", c.Until).Int("delays", c.Delays).
			Msg("issue is locked; event re-queued to run after a delay")
	default:
		log.Info().Str("reason", reason).Msg("issue is locked by another holder; event acked and dropped")
	}
}

// conflictLog is ev's logger with the holder named (and, for a shared key, its scope,
// agent and key).
func conflictLog(ev eventLog, holder lease.Info) *zerolog.Logger {
	c := ev.get().With().Str("holder", holder.Owner).Int64("holder_fence", holder.Fence)
	if holder.Scope != "" && holder.Scope != lease.ScopeAgent {
		c = c.Str("holder_agent", holder.Agent).Str("scope", string(holder.Scope)).Str("lock_key", holder.Key)
	}
	l := c.Logger()
	return &l
}

// cancelled ends an event whose lease a newer event took over (policy Supersede):
// its run (ran) or its wait for an older run has stopped. The lease is released (it
// deletes nothing: the key is the newer run's, but it tells the newer run that this
// one stopped), then the event is recorded (Conflict.Cancelled, naming the newer
// entry) and acked, the record first, as for a conflict. If that fails the entry
// stays pending; its redelivery meets the newer holder, or its release, and is
// recorded then, once (the recorder is idempotent per entry).
func (m *Middleware) cancelled(ctx context.Context, msg *message.Message, entry Entry, le *lease.Lease, by *lease.SupersededByError, ran bool, ev eventLog) error {
	_, _ = end(ctx, le, ran)
	holder := lease.Info{Agent: m.cfg.Agent, Issue: le.Issue(), MessageID: by.ByMessageID, Fence: by.Fence, Scope: lease.ScopeAgent, Key: le.Issue()}
	c := Conflict{Agent: m.cfg.Agent, Issue: le.Issue(), Message: msg, Entry: entry, Holder: holder,
		Superseded: true, Policy: Supersede, Cancelled: true, Ran: ran}
	if err := m.recordAndAck(ctx, c, true, func(redis.Pipeliner) {}); err != nil {
		ev.get().Warn().Err(err).Msg("superseded, but its record or ack failed; entry left pending")
		return fmt.Errorf("%w: record the superseded event on %s: %w", redeliver.ErrTransient, le.Issue(), err)
	}
	m.cfg.Source.Settle(entry)
	m.conflicted(ctx, c, 0, ev)
	return nil
}

// delay prepares the re-queue of msg (policy Delay): its fields as they will be
// appended again, with its delay count and origin, and when. The member is the same
// for every handling of one entry (its jitter aside, the score), so a redelivery that
// delays it again keeps one member.
func (m *Middleware) delay(ctx context.Context, msg *message.Message, entry Entry, rule Rule, c *Conflict) (string, error) {
	n, _ := strconv.Atoi(msg.Metadata.Get(event.MetaDelays))
	// Due by the clock that promotes it (the server's), not the worker's.
	now, err := delayq.Now(ctx, m.cfg.Locker.Client(), entry.Stream)
	if err != nil {
		return "", fmt.Errorf("%w: %w", redeliver.ErrTransient, err)
	}
	c.Delayed, c.Delays, c.Until = true, n+1, now.Add(rule.wait(n))
	// The copy's metadata, not msg's: the message goes on to the router as it came.
	cp := msg.Copy()
	cp.Metadata.Set(event.MetaDelays, strconv.Itoa(n+1))
	cp.Metadata.Set(event.MetaDelayedFrom, entry.ID)
	cp.Metadata.Set(event.MetaIssueKey, c.Issue)
	fields, err := m.cfg.Source.Encode(cp)
	if err != nil {
		return "", err
	}
	return delayq.Member(entry.ID, fields)
}

// FollowupOf is the mailbox record of msg, read from entry: what the holder's run is
// told (event_type, message_id, stream, correlation_id, at, and author, body and
// comment_id for a comment).
func FollowupOf(msg *message.Message, entry Entry) map[string]any {
	f := map[string]any{
		"event_type":     msg.Metadata.Get(event.MetaEventType),
		"message_id":     entry.ID,
		"stream":         entry.Stream,
		"correlation_id": msg.Metadata.Get(event.MetaCorrelationID),
		"at":             time.Now().UTC().Format(time.RFC3339Nano),
	}
	for k, name := range map[string]string{event.MetaCommentAuthor: "author", event.MetaCommentBody: "body", event.MetaCommentID: "comment_id"} {
		if v := msg.Metadata.Get(k); v != "" {
			f[name] = v
		}
	}
	return f
}
