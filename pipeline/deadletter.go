package pipeline

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
)

// Dead-letter entry fields, besides the original entry's own (uuid, payload, m:*).
const (
	DeadFieldStream   = "dead_stream"
	DeadFieldID       = "dead_id"
	DeadFieldError    = "dead_error"
	DeadFieldAttempts = "dead_attempts"
	DeadFieldAgent    = "dead_agent"
	DeadFieldAt       = "dead_at"
	// DeadFieldSize is the original size in bytes of an oversized entry, whose dead
	// letter holds a truncated copy (DeadFieldFields: its number of fields).
	DeadFieldSize   = "dead_size"
	DeadFieldFields = "dead_fields"
)

// maxDeadError bounds the error text of a dead letter (a runner's stderr tail is 2 KiB).
const maxDeadError = 8 << 10

type deadLetters struct {
	rdb      redis.UniversalClient
	stream   string
	maxLen   int64
	agent    string
	attempts int
	locker   *lockmw.Locker
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
			if _, err := Validate(msg, d.agent, d.locker); err != nil {
				return nil, d.bury(msg, src, err, 0)
			}
			out, err := h(msg)
			if err == nil || leaseOrShutdown(err) {
				return out, err
			}
			attempts, _ := strconv.Atoi(msg.Metadata.Get(MetaAttempt))
			if berr := d.bury(msg, src, err, attempts); berr != nil {
				return nil, berr
			}
			return nil, nil
		}
	}
}

// bury copies the event to the dead-letter stream and acks it, atomically (MULTI), so a
// crash cannot lose it or bury it twice. It returns nil when done (the router then acks
// a second time, for free) or the error that kept it from being done (nack: retried).
func (d *deadLetters) bury(msg *message.Message, src lockmw.Source, cause error, attempts int) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 5*time.Second)
	defer cancel()
	values := Encode(msg)
	entry, hasEntry := src.Entry(msg)
	errText := d.redactor.String(cause.Error())
	if len(errText) > maxDeadError {
		errText = errText[:maxDeadError] + "…"
	}
	values[DeadFieldStream] = entry.Stream
	values[DeadFieldID] = entry.ID
	values[DeadFieldError] = errText
	values[DeadFieldAttempts] = attempts
	values[DeadFieldAgent] = d.agent
	values[DeadFieldAt] = time.Now().UTC().Format(time.RFC3339Nano)
	if msg.Metadata.Get(metaBad) != "" {
		// An undecodable entry: keep what was there for the operator.
		values[fieldPayload] = string(msg.Payload)
	}
	oversize := msg.Metadata.Get(metaSize)
	if oversize != "" {
		values[DeadFieldSize] = oversize
		values[DeadFieldFields] = msg.Metadata.Get(metaFields)
	}
	if d.redactor.Len() > 0 {
		for k, v := range values {
			if s, ok := v.(string); ok {
				values[k] = d.redactor.String(s)
			}
		}
	}
	// MULTI makes the copy and the ack one step on a standalone Redis. On Cluster the two
	// streams live in different slots: the copy goes first, then the ack, so a crash in
	// between can bury an event twice but never lose it.
	var tx redis.Pipeliner
	if _, cluster := d.rdb.(*redis.ClusterClient); cluster {
		tx = d.rdb.Pipeline()
	} else {
		tx = d.rdb.TxPipeline()
	}
	add := tx.XAdd(ctx, &redis.XAddArgs{Stream: d.stream, MaxLen: d.maxLen, Approx: d.maxLen > 0, Values: values})
	if hasEntry {
		tx.XAck(ctx, entry.Stream, entry.Group, entry.ID)
		if oversize != "" {
			// The dead letter holds the bounded copy; the original goes, or Redis keeps
			// megabytes that no consumer will ever read.
			tx.XDel(ctx, entry.Stream, entry.ID)
		}
	}
	if _, err := tx.Exec(ctx); err != nil {
		d.log.Error().Err(err).Str("issue_key", msg.Metadata.Get(MetaIssueKey)).Str("message_id", entry.ID).
			Msg("cannot write the dead letter; the entry stays pending")
		return errors.Join(lockmw.ErrTransient, err)
	}
	if hasEntry {
		src.Settle(entry)
	}
	if d.metrics != nil {
		d.metrics.dead.WithLabelValues(d.agent).Inc()
	}
	d.log.Error().Str("error", errText).Str("issue_key", msg.Metadata.Get(MetaIssueKey)).Str("message_id", entry.ID).
		Str("correlation_id", msg.Metadata.Get(MetaCorrelationID)).Int("attempts", attempts).Str("dead_letter_id", add.Val()).
		Msg("event dead-lettered")
	if d.onDead != nil && attempts > 0 {
		// Its own bound: the dead letter is written, whatever the hook (a Jira comment) does.
		hctx, hcancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 15*time.Second)
		defer hcancel()
		d.onDead(hctx, Dead{Msg: msg, DeadID: add.Val(), Attempts: attempts, Err: cause})
	}
	return nil
}
