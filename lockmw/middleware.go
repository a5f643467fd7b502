package lockmw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Metadata keys the middleware reads and writes. The pipeline package uses the same
// names for its envelope.
const (
	MetaIssueKey      = "issue_key"
	MetaCorrelationID = "correlation_id"
	MetaFence         = "fence"
)

// Policy says what happens to an event whose issue is locked by another holder.
type Policy string

const (
	// Drop acks the event and records a lock.dropped entry (the Python behaviour).
	Drop Policy = "drop"
	// Coalesce acks the event but keeps it as the issue's single queued follow-up
	// (newest wins), published once when the holder releases.
	Coalesce Policy = "coalesce"
)

// ParsePolicy parses ON_CONFLICT.
func ParsePolicy(s string) (Policy, error) {
	switch Policy(s) {
	case Drop, "":
		return Drop, nil
	case Coalesce:
		return Coalesce, nil
	}
	return "", fmt.Errorf("lockmw: ON_CONFLICT must be drop or coalesce, got %q", s)
}

// ErrTransient wraps failures to reach Redis: the event is left for redelivery, never
// dead-lettered.
var ErrTransient = errors.New("lockmw: redis unavailable")

// ErrNoIssueKey: the event names no issue (no issue_key metadata, no Task key).
var ErrNoIssueKey = errors.New("lockmw: event has no issue key")

// Entry identifies the stream entry a message was read from.
type Entry struct {
	Stream   string
	Group    string
	Consumer string
	ID       string
	ReadAt   time.Time // when this consumer read it (XREADGROUP or XCLAIM)
}

// Source is what the middleware needs from the subscription that delivered a message.
type Source interface {
	// Entry returns the stream entry behind msg.
	Entry(msg *message.Message) (Entry, bool)
	// Settle tells the subscription that it must not XACK the entry itself: the
	// middleware acked it already (in the release's round trip), or it is not ours.
	Settle(e Entry)
	// Encode returns the stream fields that reproduce msg (coalesce policy).
	Encode(msg *message.Message) (map[string]any, error)
}

// Peeker is implemented by sources that know which entry they hand over next. The
// middleware then takes that entry's lease in the round trip that releases the current
// one and acks its entry, so the lease costs no round trip of its own on the critical
// path (policy Drop only).
type Peeker interface {
	// Peek returns the id and raw issue key of the entry delivered next, if known.
	Peek() (id, issueKey string, ok bool)
}

// Config configures Middleware.
type Config struct {
	Locker *Locker
	Agent  string
	// Source gives the stream entry behind each message; nil when messages do not come
	// from a Redis stream (the middleware then only locks).
	Source Source
	Policy Policy
	// ResultsStream receives lock.dropped and lock.coalesced records; "" for none.
	ResultsStream string
	// MaxLen trims the results stream (approximate; 0 = no). Input streams are never
	// trimmed here: a MAXLEN on them could cut pending entries.
	MaxLen int64
	// MaxIdleTime is the subscriber's claim threshold. An entry read longer ago than
	// (MaxIdleTime - heartbeat interval)/2 may have been claimed away while it waited in
	// the read-ahead buffer, so its ownership is checked before it runs.
	MaxIdleTime time.Duration
	// IssueKey extracts the raw issue key; default: metadata issue_key, else the Task
	// payload's metadata.issue or metadata.jira_issue.
	IssueKey func(msg *message.Message) (string, error)
	Logger   zerolog.Logger
}

type leaseKey struct{}

// LeaseFrom returns the lease under which the handler runs.
func LeaseFrom(ctx context.Context) (*Lease, bool) {
	le, ok := ctx.Value(leaseKey{}).(*Lease)
	return le, ok
}

// Middleware wraps a handler in the issue's lease.
//
// Order of events for one message: ownership check (only for entries that waited long
// in the read-ahead buffer), acquire (one round trip, fence included), handler with the
// lease's context, then on success release and XACK in one round trip (release first);
// on error release, then the error goes back for retry or the dead-letter queue. An
// event whose issue is held by another holder is acked and dropped (or queued, policy
// Coalesce) with a record in ResultsStream; a redelivered copy of the very entry a live
// holder is working on is neither run nor acked.
func Middleware(cfg Config) (message.HandlerMiddleware, error) {
	m, err := NewMiddleware(cfg)
	if err != nil {
		return nil, err
	}
	return m.Handler, nil
}

// LockMiddleware is Middleware with a Close, for routers that hand leases over between
// events (see Peeker): Close gives back a lease taken for an event that never came.
type LockMiddleware struct{ m *middleware }

// Handler is the message.HandlerMiddleware.
func (lm *LockMiddleware) Handler(h message.HandlerFunc) message.HandlerFunc { return lm.m.wrap(h) }

// Close releases a lease taken ahead for an event that was not delivered (shutdown).
func (lm *LockMiddleware) Close(ctx context.Context) {
	if pre := lm.m.takePre(); pre != nil {
		lm.m.giveBack(ctx, pre)
	}
}

// NewMiddleware is Middleware, returning the middleware's handle.
func NewMiddleware(cfg Config) (*LockMiddleware, error) {
	if cfg.Locker == nil || cfg.Agent == "" {
		return nil, errors.New("lockmw: Middleware needs a Locker and an Agent")
	}
	if cfg.Policy == "" {
		cfg.Policy = Drop
	}
	if cfg.Policy != Drop && cfg.Policy != Coalesce {
		return nil, fmt.Errorf("lockmw: unknown policy %q", cfg.Policy)
	}
	if cfg.Source != nil && cfg.MaxIdleTime <= cfg.Locker.HeartbeatInterval() {
		return nil, fmt.Errorf("lockmw: MAX_IDLE_TIME (%s) must exceed the lease heartbeat interval LOCK_TTL/3 (%s), "+
			"or other consumers would claim entries whose lease is alive", cfg.MaxIdleTime, cfg.Locker.HeartbeatInterval())
	}
	if cfg.IssueKey == nil {
		cfg.IssueKey = DefaultIssueKey
	}
	m := &middleware{cfg: cfg, staleAfter: (cfg.MaxIdleTime - cfg.Locker.HeartbeatInterval()) / 2}
	return &LockMiddleware{m: m}, nil
}

type middleware struct {
	cfg        Config
	staleAfter time.Duration

	mu  sync.Mutex
	pre *preLease // the next entry's lease, taken in the last release's round trip
}

// handoffWindow bounds how long a lease taken ahead waits for its entry.
const handoffWindow = time.Second

type preLease struct {
	id string
	p  *Pending
}

func (m *middleware) takePre() *preLease {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pre
	m.pre = nil
	return p
}

func (m *middleware) giveBack(ctx context.Context, pre *preLease) {
	if pre.p.Lease != nil {
		_, _ = pre.p.Lease.Release(ctx)
	}
}

// acquireOptions are the lease options for an entry of this subscription.
func (m *middleware) acquireOptions(entry Entry) AcquireOptions {
	ao := AcquireOptions{Owner: entry.Consumer, MessageID: entry.ID, Drain: m.cfg.Policy == Coalesce,
		EntryTime: entryTime(entry.ID)}
	ao.OnHeartbeat = func(ctx context.Context, pipe redis.Pipeliner) {
		// Keep our pending entry young so no claim loop takes it while we work.
		pipe.XClaimJustID(ctx, &redis.XClaimArgs{Stream: entry.Stream, Group: entry.Group,
			Consumer: entry.Consumer, Messages: []string{entry.ID}})
	}
	return ao
}

func (m *middleware) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (out []*message.Message, err error) {
		ctx := msg.Context()
		var entry Entry
		var hasEntry bool
		if m.cfg.Source != nil {
			entry, hasEntry = m.cfg.Source.Entry(msg)
		}
		log := m.cfg.Logger.With().Str("agent", m.cfg.Agent).Str("message_id", entry.ID).
			Str("correlation_id", msg.Metadata.Get(MetaCorrelationID)).Logger()

		pre := m.takePre()
		if pre != nil && (!hasEntry || pre.id != entry.ID) {
			// The subscription handed over another entry than announced: give it back.
			m.giveBack(context.WithoutCancel(ctx), pre)
			pre = nil
		}
		raw, err := m.cfg.IssueKey(msg)
		if err != nil {
			if pre != nil {
				m.giveBack(context.WithoutCancel(ctx), pre)
			}
			return nil, err
		}
		if hasEntry && time.Since(entry.ReadAt) > m.staleAfter {
			mine, err := m.ownAndRefresh(ctx, entry)
			if err != nil || !mine {
				if pre != nil {
					m.giveBack(context.WithoutCancel(ctx), pre)
				}
			}
			if err != nil {
				return nil, err
			}
			if !mine {
				log.Warn().Str("issue_key", raw).Msg("entry was claimed by another consumer while it waited here; not running it")
				m.cfg.Source.Settle(entry)
				return nil, nil
			}
		}

		var ao AcquireOptions
		if hasEntry {
			ao = m.acquireOptions(entry)
		}
		if m.cfg.Policy == Coalesce && hasEntry {
			fields, err := m.cfg.Source.Encode(msg)
			if err != nil {
				return nil, err
			}
			ao.Queue = &QueuedEvent{Stream: entry.Stream, Fields: fields}
		}
		var lease *Lease
		if pre != nil {
			lease, err = pre.p.Take(ctx)
		} else {
			lease, err = m.cfg.Locker.Acquire(ctx, m.cfg.Agent, raw, ao)
		}
		var locked *LockedError
		var superseded *SupersededError
		switch {
		case errors.As(err, &locked):
			return nil, m.conflict(ctx, msg, entry, hasEntry, locked, log)
		case errors.As(err, &superseded):
			// It waited in this consumer's read-ahead while another event's run of the
			// issue went on: dropped, exactly as if it had been seen then.
			return nil, m.conflict(ctx, msg, entry, hasEntry, &LockedError{Holder: Info{Agent: m.cfg.Agent,
				Issue: superseded.Issue, MessageID: superseded.ByMessageID}, superseded: true}, log)
		case errors.Is(err, ErrInvalidKey):
			return nil, err
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrTransient, err)
		}
		log = log.With().Str("issue_key", lease.Issue()).Int64("fence", lease.Fence()).Logger()
		msg.Metadata.Set(MetaIssueKey, lease.Issue())
		msg.Metadata.Set(MetaFence, strconv.FormatInt(lease.Fence(), 10))

		out, err = m.run(h, msg, lease)
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if lost := lease.Err(); lost != nil && !errors.Is(lost, ErrReleased) {
			// The lease ended under the handler: whatever it did is unproven. Leave the
			// entry pending; it is redelivered (to the new holder's veto, or re-run once
			// the lease is free).
			_, _ = lease.Release(cleanup)
			if errors.Is(lost, context.Canceled) && ctx.Err() != nil {
				log.Info().Msg("shutting down: lease released, entry left pending for immediate pickup")
			} else {
				log.Error().Err(lost).Msg("lease ended while the handler ran; entry left pending for redelivery")
			}
			return nil, fmt.Errorf("lockmw: %s %s: %w", m.cfg.Agent, lease.Issue(), lost)
		}
		if err != nil {
			// Release before the nack, so the retry is not dropped as "locked".
			_, _ = lease.Release(cleanup)
			return nil, err
		}
		if !hasEntry {
			_, relErr := lease.Release(cleanup)
			if relErr != nil {
				log.Warn().Err(relErr).Msg("release failed; lease expires by its TTL")
			}
			return out, nil
		}
		// Release, then ack, in one round trip; the subscriber's own XACK is skipped.
		// When the next entry is known, its lease is taken in the same round trip.
		ack := func(pipe redis.Pipeliner) { pipe.XAck(cleanup, entry.Stream, entry.Group, entry.ID) }
		var relErr error
		if next, ok := m.next(entry); ok {
			var p *Pending
			_, p, relErr = lease.ReleaseAndAcquire(cleanup, ack, next)
			if p.Lease != nil || errors.As(p.Err, new(*LockedError)) || errors.As(p.Err, new(*SupersededError)) {
				pre := &preLease{id: next.Options.MessageID, p: p}
				m.mu.Lock()
				m.pre = pre
				m.mu.Unlock()
				// The next entry normally arrives within microseconds. If it never reaches
				// this middleware (dead-lettered before it, or the subscription stops),
				// the issue must not stay locked: give the lease back after a while.
				time.AfterFunc(handoffWindow, func() {
					m.mu.Lock()
					stale := m.pre == pre
					if stale {
						m.pre = nil
					}
					m.mu.Unlock()
					if stale {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						m.giveBack(ctx, pre)
					}
				})
			}
		} else {
			_, relErr = lease.ReleaseWith(cleanup, ack)
		}
		if relErr == nil {
			m.cfg.Source.Settle(entry)
		} else {
			log.Warn().Err(relErr).Msg("release+ack failed; the subscriber retries the ack, the lease expires by its TTL")
		}
		if id := lease.Requeued(); id != "" {
			log.Info().Str("requeued_id", id).Msg("published the issue's queued follow-up")
		}
		return out, nil
	}
}

// next returns the handoff for the entry the subscription delivers after cur.
func (m *middleware) next(cur Entry) (Handoff, bool) {
	pk, ok := m.cfg.Source.(Peeker)
	if !ok || m.cfg.Policy != Drop {
		return Handoff{}, false
	}
	id, raw, ok := pk.Peek()
	if !ok || id == cur.ID || raw == "" {
		return Handoff{}, false
	}
	if _, err := m.cfg.Locker.Canonicalize(raw); err != nil {
		return Handoff{}, false // a bad event: the dead-letter path takes it, lockless
	}
	next := cur
	next.ID = id
	return Handoff{Agent: m.cfg.Agent, Key: raw, Options: m.acquireOptions(next)}, true
}

// run calls the handler with the lease in its context; a panic becomes an error so the
// lease is released and the dead-letter queue, not an endless redelivery, takes it.
func (m *middleware) run(h message.HandlerFunc, msg *message.Message, lease *Lease) (out []*message.Message, err error) {
	parent := msg.Context()
	msg.SetContext(context.WithValue(lease.Context(), leaseKey{}, lease))
	defer func() {
		msg.SetContext(parent)
		if r := recover(); r != nil {
			err = fmt.Errorf("lockmw: handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return h(msg)
}

// conflict handles an event whose issue is held by someone else.
func (m *middleware) conflict(ctx context.Context, msg *message.Message, entry Entry, hasEntry bool, locked *LockedError, log zerolog.Logger) error {
	holder := locked.Holder
	log = log.With().Str("issue_key", holder.Issue).Str("holder", holder.Owner).Int64("holder_fence", holder.Fence).Logger()
	if hasEntry && holder.MessageID == entry.ID && !locked.superseded {
		// A redelivered copy of the entry a live holder is working on (claimed while the
		// holder's heartbeat could not refresh it). Acking it would lose the holder's
		// crash recovery; running it would run it twice. The holder's next heartbeat
		// takes the entry back.
		log.Warn().Msg("entry is the live holder's in-flight entry; neither running nor acking it")
		m.cfg.Source.Settle(entry)
		return nil
	}
	eventType := "lock.dropped"
	reason := "locked"
	if locked.superseded {
		reason = "superseded"
	}
	if locked.Queued {
		eventType = "lock.coalesced"
	}
	pipe := redis.Pipeliner(nil)
	if m.cfg.ResultsStream != "" || hasEntry {
		pipe = m.cfg.Locker.rdb.Pipeline()
	}
	if m.cfg.ResultsStream != "" {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: m.cfg.ResultsStream, MaxLen: m.cfg.MaxLen, Approx: m.cfg.MaxLen > 0,
			Values: map[string]any{
				"event_type":        eventType,
				"issue_key":         holder.Issue,
				"agent":             m.cfg.Agent,
				"message_id":        entry.ID,
				"stream":            entry.Stream,
				"uuid":              msg.UUID,
				"correlation_id":    msg.Metadata.Get(MetaCorrelationID),
				"holder":            holder.Owner,
				"holder_fence":      holder.Fence,
				"holder_message_id": holder.MessageID,
				"replaced":          strconv.FormatBool(locked.Replaced),
				"reason":            reason,
				"at":                time.Now().UTC().Format(time.RFC3339Nano),
			}})
	}
	if hasEntry {
		pipe.XAck(ctx, entry.Stream, entry.Group, entry.ID)
	}
	if pipe != nil {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("%w: record %s: %w", ErrTransient, eventType, err)
		}
	}
	if hasEntry {
		m.cfg.Source.Settle(entry)
	}
	outcome := "dropped"
	if locked.Queued {
		outcome = "coalesced"
	}
	m.cfg.Locker.opts.Observer.Conflict(m.cfg.Agent, outcome, reason)
	if locked.Queued {
		log.Info().Bool("replaced", locked.Replaced).Msg("issue is locked; event queued as its follow-up")
	} else {
		log.Info().Str("reason", reason).Msg("issue is locked by another holder; event acked and dropped")
	}
	return nil
}

// ownAndRefresh reports whether entry is still pending for its consumer and, if so,
// makes it young again, in one round trip.
func (m *middleware) ownAndRefresh(ctx context.Context, e Entry) (bool, error) {
	pipe := m.cfg.Locker.rdb.Pipeline()
	pend := pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.Stream, Group: e.Group, Start: e.ID, End: e.ID, Count: 1, Consumer: e.Consumer})
	// Refresh only if it is ours: XCLAIM would otherwise move it to us. The script-free
	// way is to refresh after the check; a second round trip only on this rare path.
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("%w: check ownership of %s: %w", ErrTransient, e.ID, err)
	}
	if len(pend.Val()) == 0 {
		return false, nil
	}
	if err := m.cfg.Locker.rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: e.Stream, Group: e.Group,
		Consumer: e.Consumer, Messages: []string{e.ID}}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("%w: refresh %s: %w", ErrTransient, e.ID, err)
	}
	return true, nil
}

// entryTime is when a stream entry was added: the ms part of its id.
func entryTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(n)
}

// DefaultIssueKey reads the issue key from metadata issue_key, else from the Task
// payload: metadata.issue (triage) or metadata.jira_issue (downstream).
func DefaultIssueKey(msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(MetaIssueKey); k != "" {
		return k, nil
	}
	var task struct {
		Metadata struct {
			Issue     string `json:"issue"`
			JiraIssue string `json:"jira_issue"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(msg.Payload, &task); err != nil {
		return "", fmt.Errorf("%w: payload is not a Task: %v", ErrNoIssueKey, err)
	}
	if task.Metadata.Issue != "" {
		return task.Metadata.Issue, nil
	}
	if task.Metadata.JiraIssue != "" {
		return task.Metadata.JiraIssue, nil
	}
	return "", ErrNoIssueKey
}
