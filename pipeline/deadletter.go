package pipeline

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// maxDeadError bounds the error text of a dead letter (a runner's stderr tail is 2 KiB).
const maxDeadError = 8 << 10

// boundError bounds a dead letter's error to about maxDeadError bytes: its first
// eighth (what failed) and the rest from its end, since an agent's stderr, which ends
// the error, says why last. An ellipsis stands for what is left out.
func boundError(s string) string {
	if len(s) <= maxDeadError {
		return s
	}
	head := strings.ToValidUTF8(s[:maxDeadError/8], "")
	tail := strings.ToValidUTF8(s[len(s)-(maxDeadError-maxDeadError/8):], "")
	return head + "…" + tail
}

type deadLetters struct {
	rdb      redis.UniversalClient
	stream   string
	maxLen   int64
	agent    string
	attempts int
	locker   *lease.Locker
	log      zerolog.Logger
	metrics  *Metrics
	redactor *redact.Redactor
	onDead   func(context.Context, Dead)
}

// middleware dead-letters bad events before they reach the lock (acked, never retried,
// never locked) and events whose attempts are exhausted. Lease loss, shutdown and
// Redis outages pass through: those entries stay pending for redelivery.
func (d *deadLetters) middleware(src lockmw.Source) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if _, err := event.Validate(msg, d.agent, d.locker.Canonicalize); err != nil {
				return nil, d.bury(msg, src, err, 0)
			}
			out, err := h(msg)
			if err == nil || leaseOrShutdown(err) {
				return out, err
			}
			attempts, _ := strconv.Atoi(msg.Metadata.Get(event.MetaAttempt))
			if berr := d.bury(msg, src, err, attempts); berr != nil {
				return nil, berr
			}
			return nil, nil
		}
	}
}

// bury copies the event to the dead-letter stream and acks it, atomically on a
// standalone Redis, so a crash cannot lose it; the copy is made once per entry, so
// nothing buries it twice. It returns nil when done (the router then acks
// a second time, for free) or the error that kept it from being done (nack: retried).
func (d *deadLetters) bury(msg *message.Message, src lockmw.Source, cause error, attempts int) error {
	deadLettered(msg, cause, attempts)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
	defer cancel()
	values := event.Encode(msg)
	entry, hasEntry := src.Entry(msg)
	// Credential shapes go too (a token in a handler's error that nobody configured),
	// as in a Jira comment's text.
	errText := boundError(redact.Tokens(d.redactor.String(cause.Error())))
	values[event.DeadFieldStream] = entry.Stream
	values[event.DeadFieldID] = entry.ID
	values[event.DeadFieldError] = errText
	values[event.DeadFieldAttempts] = attempts
	values[event.DeadFieldAgent] = d.agent
	values[event.DeadFieldAt] = time.Now().UTC().Format(time.RFC3339Nano)
	if event.BadReason(msg) != "" {
		// An undecodable entry: keep what was there for the operator.
		values[event.FieldPayload] = string(msg.Payload)
	}
	oversize, fields := event.Oversize(msg)
	if oversize != "" {
		values[event.DeadFieldSize] = oversize
		values[event.DeadFieldFields] = fields
	}
	if d.redactor.Len() > 0 {
		for k, v := range values {
			if s, ok := v.(string); ok {
				values[k] = d.redactor.String(s)
			}
		}
	}
	// One script makes the copy and the ack one step on a standalone Redis. On Cluster
	// the two streams live in different slots: the copy goes first, then the ack. Either
	// way the copy is made once per entry (xonce): go-redis's retry after a lost reply,
	// or a redelivery after a crash between copy and ack, finds the first copy.
	a := xonce.Append{Stream: d.stream, ID: xonce.NewID(), Values: values, MaxLen: d.maxLen,
		Issue: event.IndexIssueOf(event.EntryIssue(d.stream, "", values), d.locker.Canonicalize)}
	if hasEntry {
		a.ID = "dead-" + entry.Stream + "-" + entry.ID
	}
	_, cluster := d.rdb.(*redis.ClusterClient)
	if hasEntry && !cluster {
		a.AckStream, a.AckGroup, a.AckID = entry.Stream, entry.Group, entry.ID
		// The dead letter holds the bounded copy; the original goes, or Redis keeps
		// megabytes that no consumer will ever read.
		a.AckDelete = oversize != ""
	}
	deadID, err := xonce.Run(ctx, d.rdb, a)
	if err == nil && hasEntry && cluster {
		pipe := d.rdb.Pipeline()
		pipe.XAck(ctx, entry.Stream, entry.Group, entry.ID)
		if oversize != "" {
			pipe.XDel(ctx, entry.Stream, entry.ID)
		}
		_, err = pipe.Exec(ctx)
	}
	if err != nil {
		d.log.Error().Err(err).Str("issue_key", msg.Metadata.Get(event.MetaIssueKey)).Str("message_id", entry.ID).
			Msg("cannot write the dead letter; the entry stays pending")
		return errors.Join(redeliver.ErrTransient, err)
	}
	if hasEntry {
		src.Settle(entry)
	}
	if d.metrics != nil {
		d.metrics.dead.Inc(d.agent)
	}
	d.log.Error().Str("error", errText).Str("issue_key", msg.Metadata.Get(event.MetaIssueKey)).Str("message_id", entry.ID).
		Str("correlation_id", msg.Metadata.Get(event.MetaCorrelationID)).Int("attempts", attempts).Str("dead_letter_id", deadID).
		Msg("event dead-lettered")
	if d.onDead != nil && attempts > 0 {
		// Its own bound: the dead letter is written, whatever the hook (a Jira comment) does.
		hctx, hcancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 15*time.Second)
		defer hcancel()
		d.onDead(hctx, Dead{Msg: msg, DeadID: deadID, Attempts: attempts, Err: cause})
	}
	return nil
}
