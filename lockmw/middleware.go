package lockmw

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Policy says what happens to an event whose issue is locked by another holder.
type Policy string

const (
	// Drop acks the event and records a conflict (the Python behaviour).
	Drop Policy = "drop"
	// Coalesce acks the event but keeps it as the issue's single queued follow-up
	// (newest wins), published once when the holder releases.
	Coalesce Policy = "coalesce"
	// Deliver makes the event a follow-up of the run that holds the issue: it is
	// appended to the lease's mailbox (the handler's run reads it while it lasts) and
	// acked in the same script; the follow-ups the run does not account for start one
	// next run (the coalesce rule). A full mailbox dead-letters the event.
	Deliver Policy = "deliver"
	// Supersede makes a newer event replace the run of an older one: its acquire takes
	// the lease over (a higher fence: the old run's fenced writes are refused), the old
	// holder's context is cancelled with a lease.SupersededByError (ErrSuperseded), its
	// event recorded (Conflict.Cancelled) and acked, and the newer event runs once the
	// old run has stopped. An event older than the holder's loses to it instead.
	Supersede Policy = "supersede"
)

// ErrSuperseded is the sentinel of a run cancelled by a newer event (policy
// Supersede): errors.Is(context.Cause(ctx), ErrSuperseded) on the handler's context.
// Such a cause is lease.ErrLeaseLost too.
var ErrSuperseded = lease.ErrSuperseded

// ParsePolicy parses a policy name: "drop" (or "", the default), "coalesce",
// "deliver", "supersede" or "wait".
func ParsePolicy(s string) (Policy, error) {
	switch Policy(s) {
	case Wait:
		return Wait, nil
	case Drop, "":
		return Drop, nil
	case Coalesce:
		return Coalesce, nil
	case Deliver:
		return Deliver, nil
	case Supersede:
		return Supersede, nil
	}
	return "", fmt.Errorf("lockmw: Config.Policy must be %q, %q, %q, %q or %q, got %q", Drop, Coalesce, Deliver, Supersede, Wait, s)
}

// Entry identifies the stream entry a message was read from.
type Entry struct {
	Stream   string
	Group    string
	Consumer string
	ID       string
	ReadAt   time.Time // when this consumer read it (XREADGROUP or XCLAIM)
}

// Source is what the middleware needs from the subscription that delivered a message.
// Implement it to let the middleware ack entries in the release's round trip and to
// guard entries against claims while they run.
type Source interface {
	// Entry returns the stream entry behind msg.
	Entry(msg *message.Message) (Entry, bool)
	// Settle tells the subscription that it must not XACK the entry itself: the
	// middleware acked it already (in the release's round trip), or it is not ours.
	Settle(e Entry)
	// Encode returns the stream fields that reproduce msg (coalesce policy).
	Encode(msg *message.Message) (map[string]any, error)
}

// Origin is implemented by sources that read one stream as one consumer group: the
// line waker of a worker none of whose events has waited yet looks there for the
// events of a key delivered but not in its line (sweepScan).
type Origin interface {
	// Origin returns the stream and the group the source reads.
	Origin() (stream, group string)
}

// Peeker is implemented by sources that know which entry they hand over next. The
// middleware then takes that entry's lease in the round trip that releases the current
// one and acks its entry, so the lease costs no round trip of its own on the critical
// path (policy Drop only).
type Peeker interface {
	// Peek returns the id and raw issue key of the entry delivered next, if known. The
	// key is empty for an entry that will not reach the middleware (a bad event that
	// the dead-letter path takes first): no lease is taken ahead for it.
	Peek() (id, issueKey string, ok bool)
}

// Waiting is an entry a subscription read ahead and has not handed over yet.
type Waiting struct {
	ID, IssueKey, EventType string
}

// Waiter is implemented by sources that read ahead: Waiting lists the entries read and
// not yet handed over, without blocking. Under policy Supersede, a newer event for the
// issue of the run under way that waits there (where it would never meet the lease)
// cancels that run, as one handled elsewhere would. Waiting must list only entries that
// pass the validation they meet when handed over (as Peek names no issue for a bad
// one): a bad event is dead-lettered there, and must not cancel a good run first.
type Waiter interface {
	Waiting() []Waiting
}

// Config configures NewMiddleware, which checks it once.
type Config struct {
	// Locker hands out the leases. Required.
	Locker *lease.Locker
	// Agent names the stage whose leases the middleware takes (lock:<agent>:<ISSUE>).
	// Required.
	Agent string
	// Source gives the stream entry behind each message. Default: nil, for messages
	// that do not come from a Redis stream (the middleware then only locks).
	Source Source
	// Policy for events whose issue is busy. Default: Drop.
	Policy Policy
	// Policies, when set, is the busy policy per event type (ParsePolicies), Policy
	// then being ignored. Policy Delay needs a Source. Default: the zero Policies, which
	// means Policy for every event type.
	Policies Policies
	// EventType gives an event's type, for Policies. Default: metadata event_type.
	EventType func(msg *message.Message) string
	// EventTypes, when set, are the only event types Policies may name
	// (Policies.CheckTypes): a rule for any other would never apply. Default: nil, any
	// type.
	EventTypes []string
	// Scopes are what the leases guard beyond the agent's own key: the issue's shared
	// key (rebase and backport of one issue never at once) and a group key taken from
	// the event (its JSON payload's field paths, or m:<name> metadata). Coalesce cannot
	// be combined with a shared scope. Default: the zero Scopes (scope agent alone).
	Scopes lease.Scopes
	// MailboxDepth bounds a lease's mailbox (policy Deliver). Default:
	// lease.DefaultMailboxDepth.
	MailboxDepth int64
	// MaxIdleTime is the subscriber's claim threshold. With a Source it must exceed the
	// lease heartbeat interval (Locker.HeartbeatInterval), or other consumers could
	// claim entries whose lease is alive. An entry read longer ago than
	// (MaxIdleTime - heartbeat interval)/2 may have been claimed away while it waited in
	// the read-ahead buffer, so its ownership is checked before it runs. Default: none
	// (required with a Source; unused without).
	MaxIdleTime time.Duration
	// IssueKey extracts the raw issue key of a message; its errors go back to the
	// router unchanged. Default: metadata event.MetaIssueKey, else ErrNoIssueKey.
	IssueKey func(msg *message.Message) (string, error)
	// OnConflict records an event that was not run because its issue was busy.
	// Default: nil, which records nothing (the Observer still counts it).
	OnConflict ConflictRecorder
	// Logger for lease losses, conflicts and failed releases. Default: the zero
	// Logger, which writes nothing.
	Logger zerolog.Logger
	// Limits are the concurrency limits (RUN_LIMITS, slots.go): before its lease a run
	// takes a slot of each limit key of its event; an event over a limit waits for one,
	// in a fair order. They need a Source. Default: none.
	Limits Limits
	// Pauses, when set, are checked after each event's lease is taken (pause.go): an
	// event of a paused scope is parked, not run. Branch is the worker's branch, for a
	// pause of agent:<agent>/<branch>. Default: nil, no pause is checked (and no round
	// trip is spent on it).
	Pauses *lease.Pauses
	Branch string
	// Now is the worker's clock, for what the middleware times on its own (the retries
	// of a failed release). Times that Redis compares are taken from the server's clock,
	// never from it: a worker whose clock is off delays nothing early or late. Default:
	// time.Now.
	Now func() time.Time
}

type leaseKey struct{}

// LeaseFrom returns the lease under which the handler runs: its Context for the work,
// its Fence and XAdd for writes that must not outlive it.
func LeaseFrom(ctx context.Context) (*lease.Lease, bool) {
	le, ok := ctx.Value(leaseKey{}).(*lease.Lease)
	return le, ok
}

// Middleware wraps Watermill handlers in the issue's lease. Build it with
// NewMiddleware, add Handler to a router's handler, and call Close when the router has
// stopped.
//
// Order of events for one message: ownership check (only for entries that waited long
// in the read-ahead buffer), acquire (one round trip, fence included), handler with the
// lease's context, then on success release and XACK in one round trip (release first);
// on error release, then the error goes back for retry or the dead-letter queue. An
// event whose issue is held by another holder is acked and dropped (or queued, policy
// Coalesce) and recorded by Config.OnConflict; a redelivered copy of the very entry a
// live holder is working on is neither run nor acked.
type Middleware struct {
	cfg        Config
	staleAfter time.Duration
	handoffs   handoffs // the next entries' leases, taken in the last release's round trip
	batch      batch    // the ends of quick runs that wait to be sent together (batch.go)
	// quick and flushAfter are batchQuick and batchFlushAfter, and sendBatch the
	// Locker's HandoffBatch: fields so that the model checker can make its runs quick
	// and plant defects in the batches (export_test.go).
	quick, flushAfter time.Duration
	sendBatch         func(context.Context, []lease.End, []lease.Next) ([]*lease.Pending, error)
	// drain: some event type's rule is Coalesce or Deliver, so follow-ups are queued
	// (every release publishes the one it finds, drain or not); takeAhead: every rule
	// can meet a conflict on a lease
	// taken ahead (Drop, Delay) and no shared scope is held, so the hand-off may take
	// the next entry's lease.
	drain, takeAhead bool
	// peeker and waiter are the Source's, when it is one (nil otherwise); batching:
	// takeAhead, with a source that names both the next entry and all it read ahead,
	// so quick runs end in batches (batch.go).
	peeker   Peeker
	waiter   Waiter
	batching bool
	// lines: some rule is Wait, so a key may have a line: every lease's release hands
	// the key to its head (lease.AcquireOptions.LineHold).
	lines bool
	// waitedIn: the stream and group (an Entry) of the last event that waited: where
	// the line waker looks for events of a key not in its line yet (sweepScan).
	waitedIn atomic.Value
}

// rule is the busy policy of msg's event type.
func (m *Middleware) rule(msg *message.Message) Rule {
	if len(m.cfg.Policies.ByType) == 0 {
		return m.cfg.Policies.Default
	}
	return m.cfg.Policies.For(m.cfg.EventType(msg))
}

// NewMiddleware checks cfg and returns the middleware. It does no I/O.
func NewMiddleware(cfg Config) (*Middleware, error) {
	if cfg.Locker == nil || cfg.Agent == "" {
		return nil, errors.New("lockmw: Config.Locker and Config.Agent are required")
	}
	// 1. The rules: the default one from Policy when none is given, each checked.
	if err := cfg.setPolicies(); err != nil {
		return nil, err
	}
	if cfg.EventType == nil {
		cfg.EventType = func(msg *message.Message) string { return msg.Metadata.Get(event.MetaEventType) }
	}
	// 2. The rules against the scopes and the source.
	if err := cfg.checkCombinations(); err != nil {
		return nil, err
	}
	// 3. The scopes and the claim timing against the Locker.
	if err := cfg.Locker.CheckScopes(cfg.Scopes); err != nil {
		return nil, fmt.Errorf("lockmw: Config.Scopes: %w", err)
	}
	if cfg.Source != nil && cfg.MaxIdleTime <= cfg.Locker.HeartbeatInterval() {
		return nil, fmt.Errorf("lockmw: Config.MaxIdleTime (%s) must exceed the lease heartbeat interval, lease.Options.TTL/3 (%s), "+
			"or other consumers would claim entries whose lease is alive", cfg.MaxIdleTime, cfg.Locker.HeartbeatInterval())
	}
	if !cfg.Limits.Empty() && cfg.Source == nil {
		return nil, errors.New("lockmw: Config.Limits need Config.Source (a stream to put a waiting event back into)")
	}
	// 4. The defaults.
	if cfg.IssueKey == nil {
		cfg.IssueKey = metadataIssueKey
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Middleware{cfg: cfg, staleAfter: (cfg.MaxIdleTime - cfg.Locker.HeartbeatInterval()) / 2,
		drain: cfg.Policies.Uses(Coalesce, Deliver), takeAhead: cfg.Policies.only(Drop, Delay) && !cfg.Scopes.Shared() && cfg.Limits.Empty(),
		lines: cfg.Policies.Uses(Wait), quick: batchQuick, flushAfter: batchFlushAfter, sendBatch: cfg.Locker.HandoffBatch}
	m.peeker, _ = cfg.Source.(Peeker)
	m.waiter, _ = cfg.Source.(Waiter)
	m.batching = m.takeAhead && m.peeker != nil && m.waiter != nil
	m.batch.life, m.batch.end = context.WithCancel(context.Background())
	return m, nil
}

// setPolicies makes the default rule from Policy when no rule is given, checks the
// rules (against EventTypes when given) and sets Policy to the default rule's.
func (cfg *Config) setPolicies() error {
	if cfg.Policies.Default.Policy == "" && len(cfg.Policies.ByType) == 0 {
		policy, err := ParsePolicy(string(cfg.Policy))
		if err != nil {
			return err
		}
		cfg.Policies = Policies{Default: Rule{Policy: policy}}
	}
	if err := cfg.Policies.check(); err != nil {
		return err
	}
	if cfg.EventTypes != nil {
		if err := cfg.Policies.CheckTypes(cfg.EventTypes); err != nil {
			return err
		}
	}
	// Policy stays the default rule's, for code that looks at it alone.
	cfg.Policy = cfg.Policies.Default.Policy
	return nil
}

// checkCombinations refuses the rules that need a Source it lacks and the rules a
// scope cannot keep.
func (cfg *Config) checkCombinations() error {
	if cfg.Policies.Uses(Delay) && cfg.Source == nil {
		return fmt.Errorf("lockmw: Config.Policies %s: policy delay needs Config.Source (a stream to re-queue into)", cfg.Policies)
	}
	if cfg.Scopes.Shared() && cfg.Policies.Uses(Coalesce, Deliver) {
		return fmt.Errorf("lockmw: Config.Policy %q cannot be combined with Config.Scopes %s: "+
			"a follow-up queued behind another agent's shared key would have nobody to publish it", cfg.Policy, cfg.Scopes)
	}
	if cfg.Policies.Uses(Wait) && cfg.Source == nil {
		return fmt.Errorf("lockmw: Config.Policies %s: policy wait needs Config.Source (a stream to put the waiting event back into)", cfg.Policies)
	}
	if cfg.Policies.Uses(Wait) && !cfg.Policies.only(Wait, Drop, Delay) {
		return fmt.Errorf("lockmw: Config.Policies %s: wait can be combined with drop and delay only: "+
			"coalesce and deliver would queue behind a key handed to the line's head, and supersede would take it over", cfg.Policies)
	}
	if cfg.Scopes.Issue && len(cfg.Scopes.Group) > 0 && cfg.Policies.Uses(Wait) {
		return fmt.Errorf("lockmw: Config.Policies %s cannot be combined with Config.Scopes %s: "+
			"an event waits in the line of one key, the shared one, and this scope holds two (issue and group); use one of them", cfg.Policies, cfg.Scopes)
	}
	if cfg.Scopes.Shared() && cfg.Policies.Uses(Supersede) {
		return fmt.Errorf("lockmw: Config.Policies %s cannot be combined with Config.Scopes %s: "+
			"supersede replaces the run holding the agent's own lease, and a shared key may be held by another agent's or another issue's run, "+
			"which an event has no standing to cancel", cfg.Policies, cfg.Scopes)
	}
	return nil
}

// Close gives back a lease taken ahead for an entry that was not delivered. Call it
// after the router has stopped.
func (m *Middleware) Close(ctx context.Context) {
	m.batch.close(ctx, m)
	giveBack(ctx, m.handoffs.close())
}

func metadataIssueKey(msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(event.MetaIssueKey); k != "" {
		return k, nil
	}
	return "", ErrNoIssueKey
}

// acquireOptions are the lease options for an entry of this subscription.
func (m *Middleware) acquireOptions(entry Entry) lease.AcquireOptions {
	ao := lease.AcquireOptions{Owner: entry.Consumer, MessageID: entry.ID, Stream: entry.Stream, Drain: m.drain,
		EntryTime: streamid.Time(entry.ID)}
	if m.lines {
		ao.LineHold = m.waitHold()
	}
	ao.OnHeartbeat = func(ctx context.Context, pipe redis.Pipeliner) {
		// Keep our pending entry young so no claim loop takes it while we work.
		pipe.XClaimJustID(ctx, &redis.XClaimArgs{Stream: entry.Stream, Group: entry.Group,
			Consumer: entry.Consumer, Messages: []string{entry.ID}})
	}
	return ao
}

// Handler is the message.HandlerMiddleware: it runs h under the issue's lease, in
// these steps: (1) the lease taken ahead for this entry, if any; (2) the issue key and,
// for an entry that waited long, its ownership; (3) the acquire, or the conflict when
// the issue is busy (under policy Wait the event joins the key's line); (4) the wait
// for runs this lease superseded; (5) the run; (6) how it ended, one value (runEnd),
// which (7) finish turns into Redis writes (a wait lease's also hand the key to the
// line's head).
func (m *Middleware) Handler(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d := m.delivery(msg)
		pre, raw, settled, err := m.prepare(&d)
		if err != nil || settled {
			return nil, err
		}
		held, settled, err := m.takeSlots(&d, raw)
		if err != nil || settled {
			pre.GiveBack(context.WithoutCancel(d.ctx))
			return nil, err
		}
		// After the lease's release: each slot is handed to its next waiter (Redis
		// Cluster; on standalone the lease's release frees them).
		defer held.end(d.ctx)
		le, err := m.take(&d, pre, raw)
		if err != nil {
			return nil, m.notTaken(&d, err)
		}
		if parked, err := m.pauseParked(&d, le); parked {
			return nil, err
		}
		start := time.Now()
		out, ran, err := m.runUnder(h, &d, le)
		d.ranFor = time.Since(start)
		return m.finish(&d, le, ended(&d, le, ran, out, err))
	}
}

// delivery is one message on its way through Handler: its stream entry (if the Source
// knows it) and its logger.
type delivery struct {
	msg      *message.Message
	ctx      context.Context
	entry    Entry
	hasEntry bool
	log      eventLog
	// slots, on standalone Redis, are the run's limits, taken with its lease
	// (lease.AcquireOptions.Slots); nil without limits, and on Redis Cluster.
	slots *lease.SlotRequest
	// ranFor is how long the run took (batch.go: a quick one's end waits for a batch).
	ranFor time.Duration
	// pauseChecked: the batch that took its lease ahead checked the pauses (pause.go).
	pauseChecked bool
}

func (m *Middleware) delivery(msg *message.Message) delivery {
	d := delivery{msg: msg, ctx: msg.Context()}
	if m.cfg.Source != nil {
		d.entry, d.hasEntry = m.cfg.Source.Entry(msg)
	}
	d.log = eventLog{base: &m.cfg.Logger, agent: m.cfg.Agent, messageID: d.entry.ID, msg: msg}
	return d
}

// prepare is Handler's steps 1 and 2: it returns the lease taken ahead for this entry
// (nil if none: one taken for another entry is given back) and the raw issue key, or
// the error to return. An entry claimed away while it waited here is settled, not run.
func (m *Middleware) prepare(d *delivery) (pre *lease.Pending, raw string, settled bool, err error) {
	if d.hasEntry {
		var skipped []ahead
		pre, skipped = m.handoffs.takePre(d.entry.ID)
		// The subscription handed over another entry than announced: the leases taken
		// ahead for the entries it skipped go back.
		giveBack(context.WithoutCancel(d.ctx), skipped)
	}
	if raw, err = m.cfg.IssueKey(d.msg); err != nil {
		pre.GiveBack(context.WithoutCancel(d.ctx))
		return nil, "", false, err
	}
	if !d.hasEntry || time.Since(d.entry.ReadAt) <= m.staleAfter {
		return pre, raw, false, nil
	}
	mine, err := m.ownAndRefresh(d.ctx, d.entry)
	if err != nil || !mine {
		pre.GiveBack(context.WithoutCancel(d.ctx))
	}
	if err != nil {
		return nil, "", false, err
	}
	if !mine {
		d.log.issue = raw
		d.log.get().Warn().Msg("entry was claimed by another consumer while it waited here; not running it")
		m.cfg.Source.Settle(d.entry)
		return nil, "", true, nil
	}
	return pre, raw, false, nil
}

// take is Handler's step 3: the lease taken ahead, bound to the message, or one
// acquired now; the message's metadata then names its issue and fence.
func (m *Middleware) take(d *delivery, pre *lease.Pending, raw string) (*lease.Lease, error) {
	var le *lease.Lease
	var err error
	if pre == nil {
		// Ends that wait for a batch are sent first, with this entry's lease and those
		// of the entries after it taken in the same round trip: its acquire must not
		// meet the lease of a run that has ended (batch.go).
		pre = m.sendWithEntry(d, raw)
	}
	if pre != nil {
		d.pauseChecked = pre.PauseChecked()
		le, err = pre.Take(d.ctx)
	} else {
		le, err = m.acquire(d.ctx, d.msg, raw, d.entry, d.hasEntry, d.slots)
	}
	if err != nil {
		return nil, err
	}
	if d.slots != nil {
		slotsTaken(d.ctx, le.Slots())
	}
	d.log.issue, d.log.fence = le.Issue(), le.Fence()
	leaseAcquired(d.ctx, le, pre != nil)
	d.msg.Metadata.Set(event.MetaIssueKey, le.Issue())
	d.msg.Metadata.Set(event.MetaFence, strconv.FormatInt(le.Fence(), 10))
	return le, nil
}

// runUnder is Handler's steps 4 and 5: it waits for every run this lease superseded,
// or that a take-over given back left stopping on its key, then runs h (ran: it did).
func (m *Middleware) runUnder(h message.HandlerFunc, d *delivery, le *lease.Lease) ([]*message.Message, bool, error) {
	if by := le.Supersedes(); by != "" {
		// The run of an older event held the issue: it is being stopped; ours starts
		// when it has (or its lease would have expired).
		d.log.get().Info().Str("supersedes", by).Msg("took the issue over from an older event's run; waiting for it to stop")
	}
	// Also when the key was free: a run superseded earlier (by a take-over that was
	// then given back) may still be stopping, and must not overlap ours. It returns
	// at once when the acquire found none.
	if err := le.WaitStopped(); err != nil {
		return nil, false, err
	}
	stopWatch := m.watchWaiting(d.msg, le, d.entry, d.hasEntry)
	out, err := m.run(h, d.msg, le)
	stopWatch()
	return out, true, err
}

// watchWaiting, under policy Supersede, looks every 50 ms while the run goes on at the
// entries the subscription read ahead: a newer one for the same issue whose rule is
// Supersede too ends the lease with a *lease.SupersededByError naming it. The lease is
// still ours in Redis (nothing else can take it while its successor waits here, and
// the successor starts only once this run has returned), so the run is cancelled and
// recorded as superseded exactly as if the newer event had met it from another
// consumer. It returns the function that stops the watch.
func (m *Middleware) watchWaiting(msg *message.Message, le *lease.Lease, entry Entry, hasEntry bool) func() {
	if m.waiter == nil || !hasEntry || m.rule(msg).Policy != Supersede {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-le.Context().Done():
				return
			case <-t.C:
			}
			for _, q := range m.waiter.Waiting() {
				if streamid.Compare(q.ID, entry.ID) <= 0 || m.policyOf(q.EventType) != Supersede {
					continue
				}
				if issue, err := m.cfg.Locker.Canonicalize(q.IssueKey); err == nil && issue == le.Issue() {
					le.Supersede(q.ID)
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// policyOf is the busy policy of an event of type eventType.
func (m *Middleware) policyOf(eventType string) Policy {
	if len(m.cfg.Policies.ByType) == 0 {
		return m.cfg.Policies.Default.Policy
	}
	return m.cfg.Policies.For(eventType).Policy
}

// releaseLater retries the release and ack of a finished event whose release failed
// (Redis unreachable), every second at most, for up to the lease TTL: past it the
// key has expired on its own, and the subscriber's ack is safe. It returns an error
// (the entry stays pending) only when ctx ends first, at shutdown.
func (m *Middleware) releaseLater(ctx context.Context, le *lease.Lease, entry Entry, first error, log eventLog) error {
	log.get().Warn().Err(first).Msg("release failed; retrying it before the entry is acked")
	expired, err := m.retryEnd(ctx, first, func(rctx context.Context) bool {
		var err error
		if le.Waits() {
			err = m.finishWaiting(rctx, le, entry)
		} else {
			_, err = le.ReleaseWith(rctx, m.ack(rctx, entry))
		}
		switch {
		case err == nil:
			m.cfg.Source.Settle(entry)
			log.get().Info().Msg("released and acked after retrying")
			return true
		case errors.Is(err, lease.ErrAfterRelease):
			log.get().Warn().Err(err).Msg("lease released, its ack failed; the subscriber retries the ack")
			return true
		}
		return false
	})
	switch {
	case err != nil:
		log.get().Warn().Msg("shutting down before the release succeeded; entry left pending")
		return err
	case expired:
		log.get().Warn().Dur("ttl", le.Locker().TTL()).Msg("release failed for a whole TTL: the lease has expired by now; the subscriber acks the entry")
	}
	return nil
}

// retryEnd is the retry loop of an end whose release failed (Redis unreachable): it
// calls try every second at most (from 100 ms on, doubling), each call with 5 s of its
// own, until try reports done or a lease TTL has passed (expired: the keys are gone by
// themselves). When ctx ends first it returns first, wrapped as transient: the entries
// stay pending.
func (m *Middleware) retryEnd(ctx context.Context, first error, try func(context.Context) bool) (expired bool, err error) {
	deadline := m.cfg.Now().Add(m.cfg.Locker.TTL())
	for wait := 100 * time.Millisecond; m.cfg.Now().Before(deadline); wait = min(2*wait, time.Second) {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("%w: %w", redeliver.ErrTransient, first)
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		done := try(rctx)
		cancel()
		if done {
			return false, nil
		}
	}
	return true, nil
}

// acquire takes the event's lease in a round trip of its own (no lease was taken ahead
// for it).
func (m *Middleware) acquire(ctx context.Context, msg *message.Message, raw string, entry Entry, hasEntry bool,
	slots *lease.SlotRequest) (*lease.Lease, error) {
	var ao lease.AcquireOptions
	if hasEntry {
		ao = m.acquireOptions(entry)
	}
	ao.Slots = slots
	if m.cfg.Scopes.Shared() {
		issue, err := m.cfg.Locker.Canonicalize(raw)
		if err != nil {
			return nil, err
		}
		if ao.Shared, err = m.cfg.Scopes.Keys(issue, msg.Payload, msg.Metadata.Get); err != nil {
			return nil, err
		}
	}
	if hasEntry && m.rule(msg).Policy == Supersede {
		// The take-over keeps the subscription's Drain: its release publishes the
		// follow-up queued behind it, or behind the run it took over, as every release
		// does (the key's own state decides).
		ao.Supersede = true
	}
	if pol := m.rule(msg).Policy; hasEntry && pol == Wait {
		var err error
		if ao.Wait, err = m.waitOptions(msg, raw, entry); err != nil {
			return nil, err
		}
	} else if hasEntry && pol == Deliver {
		var err error
		if ao.Deliver, err = m.deliverOptions(msg, entry); err != nil {
			return nil, err
		}
	} else if hasEntry && pol == Coalesce {
		fields, err := m.cfg.Source.Encode(msg)
		if err != nil {
			return nil, err
		}
		ao.Queue = &lease.QueuedEvent{Stream: entry.Stream, Fields: fields}
	}
	return m.cfg.Locker.Acquire(ctx, m.cfg.Agent, raw, ao)
}

// notAcquired handles an event whose lease was not taken: a busy issue is a conflict
// (dropped or queued), an invalid key goes back as it is, anything else is transient.
// It is out of Handler's line so that the errors.As targets cost the events that
// get their lease no allocation.
func (m *Middleware) notAcquired(ctx context.Context, msg *message.Message, entry Entry, hasEntry bool, err error, log eventLog) error {
	var locked *lease.LockedError
	var superseded *lease.SupersededError
	switch {
	case errors.As(err, &locked) && locked.Ran:
		return m.ranAlready(ctx, entry, locked, log)
	case errors.As(err, &locked):
		if locked.Stranded {
			m.wake(ctx, locked, m.scanOf(msg, entry, hasEntry), log)
		}
		return m.conflict(ctx, msg, entry, hasEntry, locked, false, log)
	case errors.As(err, &superseded):
		// It waited in this consumer's read-ahead while another event's run of the
		// issue went on: dropped, exactly as if it had been seen then.
		return m.conflict(ctx, msg, entry, hasEntry, &lease.LockedError{Holder: lease.Info{Agent: m.cfg.Agent,
			Issue: superseded.Issue, MessageID: superseded.ByMessageID}}, true, log)
	case errors.Is(err, lease.ErrInvalidKey):
		return err
	case errors.Is(err, lease.ErrLineFull):
		// Beyond the rule's MAX: dead-lettered, the reason in the error.
		return fmt.Errorf("%w: not put in the key's line: %w", event.ErrBadEvent, err)
	case errors.Is(err, lease.ErrMailboxFull):
		// Never retried into a full mailbox: the dead letter accounts for it.
		return fmt.Errorf("%w: follow-up not delivered: %w", event.ErrBadEvent, err)
	}
	return fmt.Errorf("%w: %w", redeliver.ErrTransient, err)
}

// run calls the handler with the lease in its context; a panic becomes an error so the
// lease is released and the dead-letter queue, not an endless redelivery, takes it.
func (m *Middleware) run(h message.HandlerFunc, msg *message.Message, le *lease.Lease) (out []*message.Message, err error) {
	parent := msg.Context()
	// The event format's writers (event.Publisher, event.Results) fence what they
	// append under the lease through event.FencerFrom.
	msg.SetContext(event.WithFencer(context.WithValue(le.Context(), leaseKey{}, le), le))
	defer func() {
		msg.SetContext(parent)
		if r := recover(); r != nil {
			err = fmt.Errorf("lockmw: handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return h(msg)
}

// ownAndRefresh reports whether entry is still pending for its consumer and, if so,
// makes it young again, in one round trip.
func (m *Middleware) ownAndRefresh(ctx context.Context, e Entry) (bool, error) {
	rdb := m.cfg.Locker.Client()
	pipe := rdb.Pipeline()
	pend := pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.Stream, Group: e.Group, Start: e.ID, End: e.ID, Count: 1, Consumer: e.Consumer})
	// Refresh only if it is ours: XCLAIM would otherwise move it to us. The script-free
	// way is to refresh after the check; a second round trip only on this rare path.
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("%w: check ownership of %s: %w", redeliver.ErrTransient, e.ID, err)
	}
	if len(pend.Val()) == 0 {
		return false, nil
	}
	pipe = rdb.Pipeline()
	pipe.XClaimJustID(ctx, &redis.XClaimArgs{Stream: e.Stream, Group: e.Group,
		Consumer: e.Consumer, Messages: []string{e.ID}})
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("%w: refresh %s: %w", redeliver.ErrTransient, e.ID, err)
	}
	return true, nil
}

// ack queues the XACK of e, for the round trips the middleware sends itself.
func (m *Middleware) ack(ctx context.Context, e Entry) func(redis.Pipeliner) {
	return func(pipe redis.Pipeliner) { pipe.XAck(ctx, e.Stream, e.Group, e.ID) }
}

// eventLog builds an event's logger only when something is logged: most events log
// nothing, and a zerolog child logger costs a 500-byte buffer.
type eventLog struct {
	base             *zerolog.Logger
	agent, messageID string
	msg              *message.Message
	issue            string
	fence            int64
}

// get builds the logger. Without a message (msg nil: the batch timer's and Close's
// log, of several events' ends) it names the agent alone.
func (e eventLog) get() *zerolog.Logger {
	c := e.base.With().Str("agent", e.agent)
	if e.msg != nil {
		c = c.Str("message_id", e.messageID).Str("correlation_id", e.msg.Metadata.Get(event.MetaCorrelationID))
	}
	if e.issue != "" {
		c = c.Str("issue_key", e.issue)
	}
	if e.fence != 0 {
		c = c.Int64("fence", e.fence)
	}
	l := c.Logger()
	return &l
}
