package lockmw

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
	ErrLeaseLost = errors.New("lockmw: lease lost")
	// ErrLeaseUnproven: no extend has succeeded for TTL minus the safety margin, so the
	// key may have expired on the server (Redis unreachable or too slow).
	ErrLeaseUnproven = errors.New("lockmw: lease unproven")
	// ErrMaxHold: the lease was held for longer than MaxHold; a wedged holder gives up.
	ErrMaxHold = errors.New("lockmw: lease held past its maximum hold")
	// ErrReleased: the holder released the lease.
	ErrReleased = errors.New("lockmw: lease released")
	// ErrLocked is wrapped by *LockedError when another holder has the lease.
	ErrLocked = errors.New("lockmw: issue is locked by another holder")
	// ErrSuperseded is wrapped by *SupersededError: the event entered its stream before
	// another event's run of the same issue ended (AcquireOptions.EntryTime).
	ErrSuperseded = errors.New("lockmw: event superseded by a later run")
	// ErrInvalidKey: an issue key that cannot name a lease. No Redis key is touched for
	// it; retrying cannot help.
	ErrInvalidKey = errors.New("lockmw: invalid issue key")
	// ErrNoIssueKey: the default Config.IssueKey found no MetaIssueKey metadata.
	ErrNoIssueKey = errors.New("lockmw: event has no issue key")
	// ErrTransient marks a failure that a later delivery may not meet (Redis
	// unreachable, a dependency down): the event is left pending for redelivery, never
	// dead-lettered, and uses up no attempt. The middleware wraps its Redis failures
	// in it; handlers wrap theirs (errors.Join(ErrTransient, err)) for the same
	// treatment.
	ErrTransient = errors.New("lockmw: transient failure, redeliver")
)

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

// LockedError says who holds the lease that Acquire could not take.
type LockedError struct {
	Holder Info
	// Queued: the event was stored as the issue's follow-up (coalesce policy);
	// Replaced: it replaced an older queued one.
	Queued, Replaced bool
	superseded       bool
}

func (e *LockedError) Error() string {
	h := e.Holder
	if h.Owner == "" {
		return fmt.Sprintf("%v: %s:%s (holder unknown: a plain lock key, e.g. a Python agent's)", ErrLocked, h.Agent, h.Issue)
	}
	return fmt.Sprintf("%v: %s:%s held by %s (fence %d)", ErrLocked, h.Agent, h.Issue, h.Owner, h.Fence)
}

func (e *LockedError) Unwrap() error { return ErrLocked }
