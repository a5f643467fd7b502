package pipeline

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redeliver"
	"github.com/ymirflow/ymirflow/lockmw"
)

// RunLimit bounds the run starts of a router's events by a budget that every worker of
// the agent shares through Redis (RUN_RATE, e.g. at most 30 rebase runs an hour).
type RunLimit struct {
	// Limiter holds the budget. Required.
	Limiter *ratelimit.Limiter
	// Name is the budget's name in Limiter, e.g. "run:rebase". Required.
	Name string
}

// MetaThrottled counts how often an event was re-queued by the run limit; each time
// it comes back spread over a wider window, so that a backlog over the budget does
// not come back all at once.
const MetaThrottled = "throttled"

// maxThrottleSpread bounds the window (in intervals of the rate) a re-queued event
// comes back in.
const maxThrottleSpread = 10

// runLimiter is the run limit's middleware on one subscription. It sits after the
// dead letters (a bad event spends no start) and before the lock: an event over the
// budget never takes its issue's lease.
type runLimiter struct {
	limit RunLimit
	rate  ratelimit.Rate
	src   lockmw.Source
	rdb   redis.UniversalClient
	log   zerolog.Logger
}

func newRunLimiter(l *RunLimit, src lockmw.Source, rdb redis.UniversalClient, log zerolog.Logger) (*runLimiter, error) {
	if l.Limiter == nil || l.Name == "" {
		return nil, fmt.Errorf("pipeline: RouterConfig.RunLimit: Limiter and Name are required")
	}
	rate, ok := l.Limiter.Rate(l.Name)
	if !ok {
		return nil, fmt.Errorf("pipeline: RouterConfig.RunLimit: the Limiter has no limit %q", l.Name)
	}
	return &runLimiter{limit: *l, rate: rate, src: src, rdb: rdb, log: log}, nil
}

// middleware runs the event if the budget permits its start now; otherwise it acks
// the entry and puts the event into its stream's delayed set in one script (the delay
// policy's set, in the stream's hash slot: delayq.Promote brings it back), due when the budget has room. The event is never dropped: a crash before the
// script leaves the entry pending, and a second handling of it adds the same member.
func (r *runLimiter) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		entry, ok := r.src.Entry(msg)
		if !ok {
			return h(msg) // not from a stream: nothing to re-queue into
		}
		permitted, retryAfter, err := r.limit.Limiter.Permit(msg.Context(), r.limit.Name)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", redeliver.ErrTransient, err)
		}
		if permitted {
			return h(msg)
		}
		return nil, r.requeue(msg, entry, retryAfter)
	}
}

func (r *runLimiter) requeue(msg *message.Message, entry lockmw.Entry, retryAfter time.Duration) error {
	ctx := msg.Context()
	n, _ := strconv.Atoi(msg.Metadata.Get(MetaThrottled))
	// Due by the clock that promotes it (the server's), not the worker's.
	now, err := delayq.Now(ctx, r.rdb, entry.Stream)
	if err != nil {
		return fmt.Errorf("%w: %w", redeliver.ErrTransient, err)
	}
	spread := r.rate.Interval() * time.Duration(min(n+1, maxThrottleSpread))
	until := now.Add(retryAfter + rand.N(spread+1))
	cp := msg.Copy() // msg goes back to the router as it came
	cp.Metadata.Set(MetaThrottled, strconv.Itoa(n+1))
	cp.Metadata.Set(event.MetaDelayedFrom, entry.ID)
	fields, err := r.src.Encode(cp)
	if err != nil {
		return err
	}
	member, err := delayq.Member(entry.ID, fields)
	if err != nil {
		return err
	}
	mine, err := requeueScript.Run(ctx, r.rdb, []string{entry.Stream, delayq.Key(entry.Stream)},
		entry.Group, entry.ID, entry.Consumer, until.UnixMilli(), member).Int()
	if err != nil {
		return fmt.Errorf("%w: re-queue an event over the run limit %s: %w", redeliver.ErrTransient, r.limit.Name, err)
	}
	if mine == 0 {
		// Claimed by another consumer while it waited in this one's read-ahead (theirs
		// now), or re-queued already by a try whose reply was lost.
		r.src.Settle(entry)
		r.log.Warn().Str("message_id", entry.ID).Msg("entry no longer pending for this consumer (claimed by another while it waited here, or re-queued already); not re-queueing it")
		return nil
	}
	r.src.Settle(entry)
	trace.SpanFromContext(ctx).AddEvent("run.throttled", trace.WithAttributes(
		attribute.String("ratelimit.limit", r.limit.Name), attribute.Int64("ratelimit.retry_after_ms", retryAfter.Milliseconds()),
		attribute.Int("ratelimit.throttled", n+1)))
	r.log.Info().Str("message_id", entry.ID).Str("issue_key", msg.Metadata.Get(event.MetaIssueKey)).
		Str("correlation_id", msg.Metadata.Get(event.MetaCorrelationID)).Str("limit", r.limit.Name).
		Time("delayed_until", until).Int("throttled", n+1).Msg("over the run limit: event re-queued until the budget has room")
	return nil
}

// requeueScript acks an entry and adds its event to the delayed set, if the entry is
// still pending for this consumer: one that waited in the read-ahead buffer may have
// been claimed by another consumer, which runs it; acking it then would lose that
// run's crash recovery, and the delayed copy would run it twice. NX: a second handling
// of the entry (a lost reply) keeps the first due time.
//
// KEYS: stream, delayed set (one slot). ARGV: group, id, consumer, due (ms), member.
// Returns 1 when re-queued, 0 when the entry is not this consumer's.
var requeueScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 or p[1][2] ~= ARGV[3] then return 0 end
redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// unpeeked is a subscription as the lock middleware sees it under a run limit: without
// Peek, so the lock takes no lease ahead for the next entry, which the run limit may
// re-queue before it reaches the lock (the lease would hold its issue for nothing).
type unpeeked struct{ s *subscription }

func (u unpeeked) Entry(msg *message.Message) (lockmw.Entry, bool) { return u.s.Entry(msg) }
func (u unpeeked) Settle(e lockmw.Entry)                           { u.s.Settle(e) }
func (u unpeeked) Origin() (stream, group string)                  { return u.s.Origin() }
func (u unpeeked) Encode(msg *message.Message) (map[string]any, error) {
	return u.s.Encode(msg)
}
func (u unpeeked) Waiting() []lockmw.Waiting { return u.s.Waiting() }
