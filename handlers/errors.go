package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// retryLater marks an error that is not the event's fault (Jira or Redis unavailable)
// once the event's attempts are used up: it matches redeliver.ErrTransient, so the
// pipeline leaves the entry pending and redelivers it (nack) instead of dead-lettering
// it. Its message does not claim that Redis is down.
type retryLater struct{ err error }

func (e *retryLater) Error() string   { return e.err.Error() + " (event left pending for redelivery)" }
func (e *retryLater) Unwrap() []error { return []error{e.err, redeliver.ErrTransient} }

// jiraErr classifies a failed Jira call. An interrupted call returns the interruption;
// a missing issue is a bad event (dead-lettered at once); an outage (429, 5xx, network,
// and 401/403, which an operator must fix) is retried with backoff by the pipeline and,
// once the attempts are used up, left pending for redelivery instead of dead-lettered.
func (h *handler) jiraErr(ctx context.Context, ev *job, what string, err error) error {
	wrapped := fmt.Errorf("%s of %s: jira: %s: %w", h.cfg.Agent, ev.key, what, err)
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%w: %w", wrapped, a)
	}
	if errors.Is(err, jira.ErrNotFound) {
		return fmt.Errorf("%w: %w", event.ErrBadEvent, wrapped)
	}
	if errors.Is(err, lease.ErrLeaseLost) {
		return wrapped // refused by the fence (logged there): the pipeline redelivers
	}
	transient := true
	var he *jira.HTTPError
	if errors.As(err, &he) {
		transient = he.Retryable() || he.StatusCode == http.StatusUnauthorized || he.StatusCode == http.StatusForbidden
	}
	if transient && ev.last {
		ev.log.Error().Err(err).Msg("jira unavailable on the last attempt; the event stays pending and is redelivered")
		return &retryLater{wrapped}
	}
	ev.log.Warn().Err(err).Msg("jira call failed")
	return wrapped
}

// redisErr classifies a failed Redis write (publish, results): a lost lease or an
// interruption passes through (the pipeline redelivers), anything else is retried and,
// once the attempts are used up, left pending.
func (h *handler) redisErr(ctx context.Context, ev *job, what string, err error) error {
	wrapped := fmt.Errorf("%s of %s: %s: %w", h.cfg.Agent, ev.key, what, err)
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%w: %w", wrapped, a)
	}
	if errors.Is(err, lease.ErrLeaseLost) {
		ev.log.Error().Err(err).Msg("fenced write refused: the lease is lost")
		return wrapped
	}
	if ev.last {
		return &retryLater{wrapped}
	}
	return wrapped
}

// aborted returns why ctx ended when it ended because the lease was lost or the worker
// is shutting down (the pipeline then redelivers the event), nil otherwise. A handler
// timeout is not an abort: it is a failed attempt.
func aborted(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, context.DeadlineExceeded) {
		return nil
	}
	if errors.Is(cause, context.Canceled) || errors.Is(cause, lease.ErrLeaseLost) {
		return cause
	}
	// Other lease causes (unproven, max hold): not lease.ErrLeaseLost, but the pipeline
	// must redeliver; lockmw sees the lease's end itself and says so.
	return fmt.Errorf("%w: %w", context.Canceled, cause)
}

// writable returns a context for the last attempt's bookkeeping writes: ctx, or, when
// only a handler timeout ended ctx, a short one detached from it.
func writable(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}
