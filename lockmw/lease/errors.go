package lease

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Causes of a lease context's cancellation are wrapped around the
// first four; check them with errors.Is(context.Cause(ctx), ErrLeaseLost).
var (
	// ErrLeaseLost: Redis says the lease is not ours any more (expired and maybe taken,
	// or force-released by an operator).
	ErrLeaseLost = errors.New("lease lost")
	// ErrLeaseUnproven: no extend has succeeded for TTL minus the safety margin, so the
	// key may have expired on the server (Redis unreachable or too slow).
	ErrLeaseUnproven = errors.New("lease unproven")
	// ErrMaxHold: the lease was held for longer than MaxHold; a wedged holder gives up.
	ErrMaxHold = errors.New("lease held past its maximum hold")
	// ErrReleased: the holder released the lease.
	ErrReleased = errors.New("lease released")
	// ErrLocked is wrapped by *LockedError when another holder has the lease.
	ErrLocked = errors.New("lease: issue is locked by another holder")
	// ErrSuperseded: a newer event won. Wrapped by *SupersededError (Acquire: the event
	// entered its stream before another event's run of the same issue ended,
	// AcquireOptions.EntryTime) and by *SupersededByError (a lease context's cause: a
	// newer event's acquire took the lease over, AcquireOptions.Supersede; it wraps
	// ErrLeaseLost too).
	ErrSuperseded = errors.New("lease: event superseded by a later run")
	// ErrInvalidKey: an issue key that cannot name a lease. No Redis key is touched for
	// it; retrying cannot help.
	ErrInvalidKey = errors.New("lease: invalid issue key")
	// ErrAfterRelease marks a failure of the commands sent after a release that
	// succeeded (ReleaseWith's then, Handoff's ack): the lease is gone, only the rest
	// failed.
	ErrAfterRelease = errors.New("lease: released; the commands after the release failed")
)

// ErrMailboxFull is wrapped by the error that names the holder: its mailbox holds
// DeliverOptions.MaxDepth follow-ups already; the event was not appended (nor acked).
var ErrMailboxFull = errors.New("lease: the holder's mailbox is full")

// mailboxFullError names the lease whose mailbox refused a follow-up; callers test
// for ErrMailboxFull.
type mailboxFullError struct {
	Holder Info
	Depth  int64
}

func (e *mailboxFullError) Error() string {
	return fmt.Sprintf("%v: %s:%s holds %d follow-ups", ErrMailboxFull, e.Holder.Agent, e.Holder.Issue, e.Depth)
}

func (e *mailboxFullError) Unwrap() error { return ErrMailboxFull }

// SupersededError names the run that superseded an event.
type SupersededError struct {
	Agent, Issue string
	ReleasedAt   time.Time
	ByMessageID  string
}

func (e *SupersededError) Error() string {
	return fmt.Sprintf("%v: %s:%s was worked on by message %s until %s", ErrSuperseded, e.Agent, e.Issue,
		e.ByMessageID, e.ReleasedAt.UTC().Format(time.RFC3339Nano))
}

func (e *SupersededError) Unwrap() error { return ErrSuperseded }

// SupersededByError is the cause of a lease's end when a newer event's acquire took it
// over (AcquireOptions.Supersede): the lock key holds the newer lease's token and the
// fence has moved past this lease's, so its fenced writes are refused. It is both
// ErrSuperseded and ErrLeaseLost (errors.Is): code that handles a lost lease handles
// this one, and code that must tell a replaced run from a lost one can.
type SupersededByError struct {
	Agent, Issue string
	// ByMessageID is the newer event's stream entry; Fence the newer lease's fence.
	ByMessageID string
	Fence       int64
}

func (e *SupersededByError) Error() string {
	return fmt.Sprintf("%v: %v: %s:%s was taken over by the newer event %s (fence now %d)", ErrLeaseLost, ErrSuperseded,
		e.Agent, e.Issue, e.ByMessageID, e.Fence)
}

func (e *SupersededByError) Unwrap() []error { return []error{ErrLeaseLost, ErrSuperseded} }

// LockedError says who holds the lease that Acquire could not take.
type LockedError struct {
	Holder Info
	// Issue is the canonical issue of the refused acquire: Holder.Issue, unless a shared
	// key (Holder.Scope issue or group) was busy, held by a run on another issue.
	Issue string
	// Queued: the event was stored as the issue's follow-up (coalesce policy);
	// Replaced: it replaced an older queued one.
	Queued, Replaced bool
	// Delivered: the event was appended to the holder's mailbox (deliver policy) as
	// entry MailboxID, the mailbox then holding Depth entries. Duplicate: an earlier try
	// whose reply was lost appended it already (MailboxID is then empty). No script
	// that answers with a LockedError acks the event's entry: its caller does, after
	// writing the event's record, so that a reply lost past go-redis's retries leaves
	// the entry pending for a repeat that records it.
	Delivered, Duplicate bool
	// Own: the refused event is the holder's own entry (AcquireOptions.MessageID names
	// the message the agent key's holder runs: its entry claimed from its dead worker
	// while the lease lives). Nothing was queued, delivered or put in a line: acked, it
	// would lose the holder's crash recovery; run, it would run twice.
	Own bool
	// Newer (AcquireOptions.Supersede): the holder's event is newer than the refused
	// one (its stream id is higher), so the refused event lost to it rather than
	// superseding it.
	Newer     bool
	MailboxID string
	Depth     int64
	// Wait policy (AcquireOptions.Wait): Waited, the event waits in the key's line
	// (Position, 1 the head; OldestAt, when the head joined), Duplicate when it did
	// already; Ran, it ran to its end already (a redelivered copy, not run);
	// Stranded, the key is free and nobody's turn while events wait (a lost wake-up:
	// Locker.WakeLine).
	Waited, Ran, Stranded bool
	Position              int64
	OldestAt              time.Time
	// Line is the shared key whose line the event waits in (a wait lease with scope
	// issue or group: Locker.WakeSharedLine wakes it); zero for the agent's own key.
	Line ScopeKey
}

func (e *LockedError) Error() string {
	h := e.Holder
	if h.Owner == "" {
		return fmt.Sprintf("%v: %s:%s (holder unknown: a plain lock key, e.g. a Python agent's)", ErrLocked, h.Agent, h.Issue)
	}
	if h.Scope != "" && h.Scope != ScopeAgent {
		return fmt.Sprintf("%v: %s key %s held by %s:%s, %s (fence %d)", ErrLocked, h.Scope, h.Key, h.Agent, h.Issue, h.Owner, h.Fence)
	}
	return fmt.Sprintf("%v: %s:%s held by %s (fence %d)", ErrLocked, h.Agent, h.Issue, h.Owner, h.Fence)
}

func (e *LockedError) Unwrap() error { return ErrLocked }
