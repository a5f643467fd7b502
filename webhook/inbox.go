package webhook

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// inboxBlock is how long one XREADGROUP of the inbox waits for a delivery; it bounds how
// long Run takes to see ctx end, and how late a claim pass can be.
const inboxBlock = time.Second

// claimInterval is how often Run looks for stored deliveries that failed or were left by
// a dead receiver (idle longer than RetryAfter).
const claimInterval = 5 * time.Second

// Run classifies the deliveries ServeHTTP stored in the inbox, until ctx ends: one at a
// time, oldest first (two deliveries of one issue are classified in the order Jira sent
// them), through the same rules as before the inbox (scope, payload or Jira read,
// fetcher.Process). A classified delivery is acked and deleted, and its delivery id
// remembered; one whose classification failed (Jira or Redis unavailable, ProcessTimeout)
// stays pending and is taken again after RetryAfter, by this receiver or another replica,
// at most MaxAttempts times. A receiver that dies leaves its entry pending: another takes
// it after RetryAfter. Nothing is acked before it is handled.
//
// Run returns nil when ctx ends; while Redis is unreachable it waits and retries (the
// deliveries are in Redis: there is nothing to do without it).
func (r *Receiver) Run(ctx context.Context) error {
	inbox := InboxStream(r.cfg.Topology)
	log := r.log.With().Str("inbox", inbox).Str("consumer", r.cfg.Consumer).Logger()
	for warned := false; ; warned = true {
		err := r.cfg.Redis.XGroupCreateMkStream(ctx, inbox, InboxGroup, "0").Err()
		if err == nil || redis.HasErrorPrefix(err, "BUSYGROUP") {
			break
		}
		if !warned {
			log.Warn().Err(err).Msg("inbox group not created; retrying")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(inboxBlock):
		}
	}
	log.Info().Msg("classifying stored deliveries")
	nextClaim := time.Time{} // at once: what a previous run left
	failing := false
	for ctx.Err() == nil {
		if !time.Now().Before(nextClaim) {
			nextClaim = time.Now().Add(claimInterval)
			r.claimPass(ctx, inbox)
		}
		res, err := r.cfg.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: InboxGroup, Consumer: r.cfg.Consumer,
			Streams: []string{inbox, ">"}, Count: 1, Block: inboxBlock}).Result()
		switch {
		case errors.Is(err, redis.Nil) || ctx.Err() != nil:
			continue
		case redis.HasErrorPrefix(err, "NOGROUP"):
			// The inbox was deleted (FLUSHDB, a namespace reset): make it again.
			_ = r.cfg.Redis.XGroupCreateMkStream(ctx, inbox, InboxGroup, "0").Err()
			continue
		case err != nil:
			if !failing {
				log.Warn().Err(err).Msg("inbox unreadable; retrying")
			}
			failing = true
			select { // a short pause, not a hot loop, while Redis is away
			case <-ctx.Done():
			case <-time.After(inboxBlock):
			}
			continue
		}
		if failing {
			log.Info().Msg("inbox readable again")
			failing = false
		}
		for _, s := range res {
			for _, m := range s.Messages {
				r.process(ctx, inbox, m, 1)
			}
		}
	}
	return nil
}

// claimPass takes the inbox's entries idle longer than RetryAfter (failed, or left by a
// dead receiver) and classifies them again, or gives them up after MaxAttempts.
func (r *Receiver) claimPass(ctx context.Context, inbox string) {
	for ctx.Err() == nil {
		stale, err := r.cfg.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: inbox, Group: InboxGroup,
			Idle: r.cfg.RetryAfter, Start: "-", End: "+", Count: 10}).Result()
		if err != nil || len(stale) == 0 {
			return
		}
		attempts := map[string]int64{}
		ids := make([]string, 0, len(stale))
		for _, p := range stale {
			attempts[p.ID] = p.RetryCount + 1
			ids = append(ids, p.ID)
		}
		// XCLAIM re-checks the idle time: an entry another replica took meanwhile is
		// not taken twice.
		msgs, err := r.cfg.Redis.XClaim(ctx, &redis.XClaimArgs{Stream: inbox, Group: InboxGroup, Consumer: r.cfg.Consumer,
			MinIdle: r.cfg.RetryAfter, Messages: ids}).Result()
		if err != nil {
			return
		}
		for _, m := range msgs {
			r.process(ctx, inbox, m, attempts[m.ID])
		}
		if len(stale) < 10 {
			return
		}
	}
}

// process classifies one stored delivery (its attempt-th time) and acks it unless it is
// to be retried.
func (r *Receiver) process(ctx context.Context, inbox string, m redis.XMessage, attempt int64) {
	start := time.Now()
	body, _ := m.Values["body"].(string)
	delivery, _ := m.Values["delivery"].(string)
	sctx, span := r.startDelivery(ctx, delivery, m.ID, attempt)
	res := r.classify(sctx, body, delivery, m.ID)
	endDelivery(span, res)
	took := time.Since(start)
	done := res.status < 500
	if !done && ctx.Err() != nil {
		return // shutting down: the entry stays pending for the next receiver
	}
	gaveUp := !done && attempt >= int64(r.cfg.MaxAttempts)
	// Counted and logged before the entry leaves the inbox: an empty inbox then means every
	// delivery in it is classified and accounted for, whoever watches it.
	r.cfg.Metrics.observeProcessed(res.status, res.outcome, took)
	if gaveUp {
		r.cfg.Metrics.observeProcessed(res.status, "gave_up", 0)
	}
	r.logProcessed(res, m.ID, delivery, attempt, start, took, done, gaveUp)
	if r.processed != nil {
		r.processed(m.ID, res)
	}
	if done || gaveUp {
		// Ack and delete in one round trip: the inbox holds only the backlog. Should it
		// fail, the entry is classified again after RetryAfter (idempotent publish) or
		// dropped as a duplicate.
		pipe := r.cfg.Redis.Pipeline()
		pipe.XAck(ctx, inbox, InboxGroup, m.ID)
		pipe.XDel(ctx, inbox, m.ID)
		if _, err := pipe.Exec(ctx); err != nil {
			r.log.Warn().Err(err).Str("inbox_id", m.ID).Msg("stored delivery not acked; taken again after RetryAfter")
		}
	}
}

// logProcessed logs one classification: info for a publish, warn for a retry to come,
// error for a delivery given up.
func (r *Receiver) logProcessed(res result, inboxID, delivery string, attempt int64, start time.Time, took time.Duration, done, gaveUp bool) {
	ev := r.log.Debug()
	switch {
	case gaveUp:
		ev = r.log.Error().Err(res.err).Int64("attempts", attempt).Str("gave_up", "the next sweep still sees the issue")
	case !done:
		ev = r.log.Warn().Err(res.err).Int64("attempt", attempt).Str("retry_after", r.cfg.RetryAfter.String())
	case res.outcome == "published" || res.outcome == "followup_published":
		ev = r.log.Info()
	}
	ev.Int("status", res.status).Str("outcome", res.outcome).Str("issue_key", res.issue).Str("delivery", delivery).
		Str("inbox_id", inboxID).Str("entry_id", res.entryID).Dur("took", took).
		Dur("waited", start.Sub(inboxTime(inboxID))).Msg(res.detail)
}

// classify is the work ServeHTTP used to do after its checks: the duplicate check (a
// delivery Jira retried while its first copy waited in the inbox), the rules, and the
// delivery id remembered once handled.
func (r *Receiver) classify(ctx context.Context, body, delivery, inboxID string) result {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ProcessTimeout)
	defer cancel()
	e, err := parseEvent([]byte(body))
	if err != nil { // checked before it was stored; a foreign entry in the inbox
		return refused(http.StatusBadRequest, "malformed", err.Error())
	}
	var dkey string
	if delivery != "" {
		dkey = DeliveryKey(r.cfg.Topology, delivery)
		by, err := r.cfg.Redis.Get(ctx, dkey).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", detail: "Redis: delivery check failed", err: err}
		}
		if err == nil && by != inboxID {
			return accepted("duplicate", "delivery already handled")
		}
	}
	res := r.handle(ctx, e)
	if e.Issue != nil && res.issue == "" {
		res.issue = e.Issue.Key
	}
	if res.status == http.StatusAccepted && dkey != "" {
		// Remembered only once handled: a delivery that failed is classified again. A
		// failed write costs no more than a repeat of idempotent work.
		if err := r.cfg.Redis.Set(ctx, dkey, inboxID, r.cfg.DeliveryTTL).Err(); err != nil {
			r.log.Warn().Err(err).Str("delivery", delivery).Msg("delivery id not remembered; a retry would be handled again (idempotent)")
		}
	}
	return res
}

// inboxTime is when an inbox entry was stored (its id's milliseconds).
func inboxTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	var n int64
	for _, c := range ms {
		if c < '0' || c > '9' {
			return time.Now()
		}
		n = n*10 + int64(c-'0')
	}
	return time.UnixMilli(n)
}
