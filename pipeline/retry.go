package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// retry retries failed attempts inside the lease, with exponential backoff (initial,
// doubling, at most a minute); it never retries bad events, lease loss or shutdown, and
// stops waiting when the lease's context ends. (Watermill's middleware.Retry advances
// its backoff once more each time ShouldRetry or OnRetryHook reads it, so its waits
// grow far faster than configured.)
func retry(attempts int, initial time.Duration, log zerolog.Logger) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			delay := initial
			for attempt := 1; ; attempt++ {
				out, err := h(msg)
				if err == nil || attempt >= attempts || permanentOrAbort(err) {
					return out, err
				}
				log.Debug().Err(err).Int("attempt", attempt).Dur("delay", delay).
					Str("issue_key", msg.Metadata.Get(event.MetaIssueKey)).Msg("retrying handler")
				t := time.NewTimer(delay)
				select {
				case <-msg.Context().Done():
					t.Stop()
					return nil, errors.Join(err, context.Cause(msg.Context()))
				case <-t.C:
				}
				// No attempt starts without the lease: it may have been taken away (a force
				// release whose announcement was missed) while this one waited.
				// A check that cannot reach Redis proves nothing either way: the attempt
				// goes ahead, its writes fenced as always.
				if le, ok := lockmw.LeaseFrom(msg.Context()); ok {
					if cerr := le.Check(msg.Context()); errors.Is(cerr, lease.ErrLeaseLost) {
						return nil, errors.Join(err, cerr)
					}
				}
				delay = min(2*delay, time.Minute)
			}
		}
	}
}

// permanentOrAbort: errors that a retry cannot fix (bad events) or that must end the
// attempt now (lease lost, shutdown).
func permanentOrAbort(err error) bool {
	return errors.Is(err, event.ErrBadEvent) || errors.Is(err, event.ErrOutcomeRecorded) || errors.Is(err, lease.ErrInvalidKey) || errors.Is(err, lockmw.ErrNoIssueKey) ||
		leaseOrShutdown(err)
}

func leaseOrShutdown(err error) bool {
	return errors.Is(err, lease.ErrLeaseLost) || errors.Is(err, lease.ErrLeaseUnproven) ||
		errors.Is(err, redeliver.ErrTransient) || errors.Is(err, context.Canceled)
}
