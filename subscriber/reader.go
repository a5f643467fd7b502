package subscriber

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// reader is one Subscribe: one stream, two loops. fill reads ahead (a batch, or one
// entry) whenever fewer than KeepAhead entries wait, so the next entry is known while one is handled
// (Peek, Waiting); run hands the entries over one at a time.
type reader struct {
	s      *Subscriber
	stream string
	out    chan<- *message.Message
	log    zerolog.Logger

	ahead   []redis.XMessage // read, not yet handed over, in read order; guarded by s.mu
	held    bool             // HandBack took them: read no more until the message handled now is acked; guarded by s.mu
	busy    bool             // a message is handed over and not acked; guarded by s.mu
	parked  bool             // fill waits, drained: no read in flight, nothing to give back; guarded by s.mu
	giving  []string         // entries given back whose XCLAIM IDLE is still to succeed; fill's own
	filled  chan struct{}    // fill → run: entries were read
	drained chan struct{}    // run → fill: ahead was emptied, or a message acked

	// lastRead is the newest entry a read of new entries returned; lost, that such a
	// read failed: its entries may be ours unseen (recoverLost). fill's own.
	lastRead string
	lost     bool
	// lostClaim is what a claim pass's XCLAIM asked for when it failed: those it took
	// may be ours unseen (recoverClaim). fill's own.
	lostClaim []string

	nextClaim time.Time // zero: a claim pass is due now
	nextCheck time.Time // when idle consumers are looked for next
	claimFrom string    // where the next claim pass starts listing ("-": the start)
}

// retryWait is how long the loop waits after a Redis error before it tries again.
const retryWait = 500 * time.Millisecond

// run hands the entries over, one at a time, until ctx ends.
func (r *reader) run(ctx context.Context) {
	for {
		m, ok := r.next(ctx)
		if !ok {
			return
		}
		more := r.deliver(ctx, m)
		r.idle()
		if !more {
			return
		}
	}
}

// next waits for the next entry read ahead; false once ctx ends.
func (r *reader) next(ctx context.Context) (redis.XMessage, bool) {
	for {
		if m, ok := r.pop(); ok {
			return m, true
		}
		select {
		case <-r.filled:
		case <-ctx.Done():
			return redis.XMessage{}, false
		}
	}
}

// pop takes the next entry read ahead.
func (r *reader) pop() (redis.XMessage, bool) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if len(r.ahead) == 0 || r.s.drain.on {
		return redis.XMessage{}, false
	}
	r.busy = true
	m := r.ahead[0]
	r.ahead[0] = redis.XMessage{}
	r.ahead = r.ahead[1:]
	if len(r.ahead) == 0 {
		r.ahead = nil
	}
	if len(r.ahead) < r.s.cfg.KeepAhead {
		signal(r.drained)
	}
	return m, true
}

// unpop puts m, taken by pop and not handed over, back at the front of the read-ahead.
func (r *reader) unpop(m redis.XMessage) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.ahead = append([]redis.XMessage{m}, r.ahead...)
}

// fill reads ahead until ctx ends: whenever fewer than KeepAhead entries wait (and
// HandBack did not just take them), a claim pass when one is due, else a read.
func (r *reader) fill(ctx context.Context) {
	for {
		// Taken whether or not the read-ahead has room: they are ours already.
		if err := r.recoverTaken(ctx); err != nil {
			if !r.goOn(ctx, err, "taking the entries of a read or claim whose reply was lost failed; retrying") {
				return
			}
			continue
		}
		if !r.waitDrained(ctx) {
			return
		}
		if r.draining() {
			r.giveBack(ctx)
			continue
		}
		var err error
		if r.nextCheck.IsZero() {
			r.nextCheck = time.Now().Add(r.s.cfg.ConsumerTimeout / 2)
		} else if time.Now().After(r.nextCheck) {
			r.nextCheck = time.Now().Add(r.s.cfg.ConsumerTimeout / 2)
			r.dropIdleConsumers(ctx)
		}
		if !time.Now().Before(r.nextClaim) {
			err = r.claim(ctx)
		} else {
			err = r.read(ctx)
		}
		if err != nil && !r.goOn(ctx, err, "reading the stream failed; retrying") {
			return
		}
	}
}

// goOn decides what fill does after err: false (it ends) when the client was closed
// under the subscriber; else it logs msg, waits retryWait and says go on. An error of
// a ctx that ended is not logged.
func (r *reader) goOn(ctx context.Context, err error, msg string) bool {
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, redis.ErrClosed):
		r.log.Error().Msg("the client was closed under the subscriber: it reads no more")
		return false
	default:
		r.log.Warn().Err(err).Msg(msg)
		r.pause(ctx, retryWait)
	}
	return true
}

// waitDrained waits until fewer than KeepAhead entries wait and reading is not held;
// false once ctx ends.
func (r *reader) waitDrained(ctx context.Context) bool {
	for {
		r.s.mu.Lock()
		need := len(r.ahead) < r.s.cfg.KeepAhead && !r.held && !r.s.drain.on
		if r.s.drain.on {
			need = len(r.ahead) > 0 || len(r.giving) > 0 // to give back
		}
		r.parked = r.s.drain.on && !need
		r.s.mu.Unlock()
		if need {
			return ctx.Err() == nil
		}
		select {
		case <-r.drained:
		case <-ctx.Done():
			return false
		}
	}
}

// keep stamps msgs, appends them to what was read ahead, and tells the observer, then
// run.
func (r *reader) keep(msgs []redis.XMessage) {
	if len(msgs) == 0 {
		return
	}
	stamp(r.stream, msgs, time.Now())
	r.s.mu.Lock()
	r.ahead = append(r.ahead, msgs...)
	r.s.mu.Unlock()
	if obs := r.s.cfg.Observer; obs != nil {
		obs.Read(r.stream, msgs)
	}
	signal(r.filled)
}

// read sends one XREADGROUP for new entries, with the acks queued so far in front of
// it in the same round trip (then without BLOCK: a read that finds nothing is sent
// again alone, blocking).
func (r *reader) read(ctx context.Context) error {
	count := int64(1)
	if cfg := r.s.cfg; cfg.ReadBatch > 1 && (cfg.BatchNow == nil || cfg.BatchNow()) {
		count = int64(cfg.ReadBatch)
	}
	block := max(min(r.s.cfg.BlockTime, time.Until(r.nextClaim)), time.Millisecond)
	args := &redis.XReadGroupArgs{Group: r.s.cfg.Group, Consumer: r.s.cfg.Consumer,
		Streams: []string{r.stream, ">"}, Count: count, Block: block}
	if obs := r.s.cfg.Observer; obs != nil {
		defer obs.Reading()()
	}
	if done, err := r.readWithAcks(ctx, args); done || err != nil {
		return err
	}
	cmd := r.newRead(ctx, args)
	_ = r.s.cfg.Client.Process(ctx, cmd)
	res, err := cmd.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.lost = r.lost || ctx.Err() == nil
		return r.readFailed(ctx, err)
	}
	if len(res) > 0 {
		r.keepRead(res[0].Messages)
	}
	return nil
}

// readCmd is an XREADGROUP of new entries that go-redis never sends again (NoRetry):
// sent again after its reply was lost, it would return newer entries and leave the
// first one's ours unseen. It fails instead, and recoverLost takes them.
type readCmd struct{ *redis.XStreamSliceCmd }

// NoRetry keeps go-redis from sending the read again, alone or in a pipeline.
func (readCmd) NoRetry() bool { return true }

// newRead builds the read of args as go-redis's XReadGroup does (its BLOCK read
// timeout included), queued in a pipeline that is never sent.
func (r *reader) newRead(ctx context.Context, args *redis.XReadGroupArgs) readCmd {
	return readCmd{r.s.cfg.Client.Pipeline().XReadGroup(ctx, args)}
}

// keepRead keeps the entries a read of new entries returned (keep) and remembers the
// newest.
func (r *reader) keepRead(msgs []redis.XMessage) {
	if len(msgs) > 0 {
		r.lastRead = msgs[len(msgs)-1].ID
	}
	r.keep(msgs)
}

// recoverTaken takes the entries that a read or a claim pass whose reply was lost took for
// this consumer (recoverLost, recoverClaim), if one was.
func (r *reader) recoverTaken(ctx context.Context) error {
	if ctx.Err() != nil {
		return nil
	}
	if r.lost {
		if err := r.recoverLost(ctx); err != nil {
			return err
		}
	}
	if len(r.lostClaim) > 0 {
		return r.recoverClaim(ctx)
	}
	return nil
}

// recoverLost takes the entries that a read whose reply was lost (the connection cut
// after Redis had answered) delivered to this consumer: pending for it, newer than
// the newest entry a read returned it, delivered once (a claim counts a second
// delivery), and not given back (idle past MaxIdleTime: any claim pass takes those).
// It claims them again with their delivery count kept at 1 (the lost read handed
// them to no handler) and keeps them. Without it they wait for a claim pass after
// MaxIdleTime. A reader that shares its stream with another of this subscriber's leaves
// them to the claim pass: it cannot tell their entries from lost ones.
func (r *reader) recoverLost(ctx context.Context) error {
	cfg := r.s.cfg
	if !r.s.alone(r) {
		r.lost = false
		return nil
	}
	start := "-"
	if r.lastRead != "" {
		start = "(" + r.lastRead
	}
	for {
		pend, err := cfg.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: cfg.Group,
			Start: start, End: "+", Count: 100, Consumer: cfg.Consumer}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return r.readFailed(ctx, err)
		}
		if err := r.reclaim(ctx, pend); err != nil {
			return r.readFailed(ctx, err)
		}
		if len(pend) < 100 {
			r.lost = false
			return nil
		}
		start = "(" + pend[len(pend)-1].ID
	}
}

// reclaim claims the entries of pend that a lost read delivered (recoverLost) and
// keeps them.
func (r *reader) reclaim(ctx context.Context, pend []redis.XPendingExt) error {
	var lost []redis.XPendingExt
	for _, p := range pend {
		if p.RetryCount == 1 && p.Idle < r.s.cfg.MaxIdleTime {
			lost = append(lost, p)
		}
	}
	msgs, err := r.claimAgain(ctx, lost)
	if err != nil {
		return err
	}
	if len(msgs) > 0 {
		r.log.Info().Int("entries", len(msgs)).Msg("a read's reply was lost: took the entries it had delivered")
	}
	r.keepRead(msgs) // newer than lastRead, as recoverLost lists them
	return nil
}

// claimAgain claims the entries of pend for this consumer again, in one round trip,
// each with its delivery count as pend gives it (no handler saw them: no retry is
// spent). Sent again after a lost reply, it does the same.
func (r *reader) claimAgain(ctx context.Context, pend []redis.XPendingExt) ([]redis.XMessage, error) {
	if len(pend) == 0 {
		return nil, nil
	}
	cfg := r.s.cfg
	pipe := cfg.Client.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(pend))
	for i, p := range pend {
		cmds[i] = redis.NewXMessageSliceCmd(ctx, r.s.claimArgs(r.stream, 0, []string{p.ID}, "RETRYCOUNT", p.RetryCount)...)
		_ = pipe.Process(ctx, cmds[i])
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var msgs []redis.XMessage
	for _, c := range cmds {
		msgs = append(msgs, c.Val()...)
	}
	return msgs, nil
}

// readWithAcks sends the acks queued so far and, behind them in the same round trip, a
// read without BLOCK; done is false when there were no acks or the read found nothing.
// The round trip is not cut short by Close (its acks would be lost): it is quick.
func (r *reader) readWithAcks(ctx context.Context, args *redis.XReadGroupArgs) (done bool, err error) {
	a := r.s.acks
	a.sending.Lock()
	defer a.sending.Unlock()
	acks := a.take()
	if len(acks) == 0 {
		return false, nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	pipe := r.s.cfg.Client.Pipeline()
	ackCmds := a.queue(sctx, pipe, acks)
	nonBlocking := *args
	nonBlocking.Block = -1
	rd := r.newRead(sctx, &nonBlocking)
	_ = pipe.Process(sctx, rd)
	_, _ = pipe.Exec(sctx) // each command's error is in its own result
	a.settle(acks, ackCmds)
	if err := rd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		r.lost = r.lost || ctx.Err() == nil
		return false, r.readFailed(ctx, err)
	}
	if res := rd.Val(); len(res) > 0 && len(res[0].Messages) > 0 {
		r.keepRead(res[0].Messages)
		return true, nil
	}
	return false, nil
}

// readFailed recreates the group when it is gone (the stream was deleted), and
// returns err otherwise.
func (r *reader) readFailed(ctx context.Context, err error) error {
	if strings.HasPrefix(err.Error(), "NOGROUP") {
		if cerr := createGroup(ctx, r.s.cfg.Client, r.stream, r.s.cfg.Group); cerr == nil {
			r.log.Warn().Msg("the consumer group was gone: created it again")
			return nil
		}
	}
	return err
}

// claim runs one claim pass: the entries idle past MaxIdleTime (from claimFrom),
// those the veto allows claimed in one XCLAIM. XCLAIM's MIN-IDLE-TIME makes two
// consumers' passes take an entry once; an entry deleted from the stream meanwhile
// leaves the pending list without being returned.
func (r *reader) claim(ctx context.Context) error {
	cfg := r.s.cfg
	r.s.acks.flush(ctx) // an entry acked here must not look idle to our own pass
	pend, err := cfg.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: cfg.Group,
		Idle: cfg.MaxIdleTime, Start: r.claimFrom, End: "+", Count: int64(cfg.ClaimBatch)}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.nextClaim = time.Now().Add(cfg.ClaimInterval)
		return r.readFailed(ctx, err)
	}
	// A full page: the next pass goes on from its end right after this batch is
	// handled. Otherwise the next pass starts over after ClaimInterval.
	if len(pend) == cfg.ClaimBatch {
		r.claimFrom, r.nextClaim = "("+pend[len(pend)-1].ID, time.Time{}
	} else {
		r.claimFrom, r.nextClaim = "-", time.Now().Add(cfg.ClaimInterval)
	}
	ids := make([]string, 0, len(pend))
	for _, p := range pend {
		if cfg.ShouldClaim == nil || cfg.ShouldClaim(ctx, p) {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	cmd := claimCmd{redis.NewXMessageSliceCmd(ctx, r.s.claimArgs(r.stream, cfg.MaxIdleTime.Milliseconds(), ids)...)}
	_ = cfg.Client.Process(ctx, cmd)
	msgs, err := cmd.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.lostClaim = ids
		return err
	}
	if len(msgs) > 0 {
		r.log.Debug().Int("entries", len(msgs)).Msg("claimed entries idle past MaxIdleTime")
	}
	r.keep(msgs)
	return nil
}

// claimCmd is a claim pass's XCLAIM, never sent again by go-redis (NoRetry): sent
// again after its reply was lost, it would find the entries the first one took no
// longer idle, return none, and leave them ours unseen until MaxIdleTime. It fails
// instead, and recoverClaim takes them.
type claimCmd struct{ *redis.XMessageSliceCmd }

// NoRetry keeps go-redis from sending the claim again.
func (claimCmd) NoRetry() bool { return true }

// recoverClaim takes the entries that a claim pass's XCLAIM whose reply was lost took:
// of the ids it asked for, those pending for this consumer and idle under MaxIdleTime
// (its claim reset their idle; one it did not take is still idle past it, for the
// next pass). It claims them again, their delivery count as that claim left it, and
// keeps them in order. A reader that shares its stream with another of this
// subscriber's leaves them to the claim pass: the other's pass may have taken them,
// and handed them over itself.
func (r *reader) recoverClaim(ctx context.Context) error {
	if !r.s.alone(r) {
		r.lostClaim = nil
		return nil
	}
	pend, err := r.ownPending(ctx, r.lostClaim)
	if err != nil {
		return r.readFailed(ctx, err)
	}
	var taken []redis.XPendingExt
	for _, p := range pend {
		if p.Idle < r.s.cfg.MaxIdleTime {
			taken = append(taken, p)
		}
	}
	msgs, err := r.claimAgain(ctx, taken)
	if err != nil {
		return err
	}
	r.lostClaim = nil
	if len(msgs) > 0 {
		r.log.Info().Int("entries", len(msgs)).Msg("a claim's reply was lost: took the entries it had claimed")
	}
	r.keep(msgs)
	return nil
}

// ownPending lists which of ids are pending for this consumer, in one round trip.
func (r *reader) ownPending(ctx context.Context, ids []string) ([]redis.XPendingExt, error) {
	cfg := r.s.cfg
	pipe := cfg.Client.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: cfg.Group,
			Start: id, End: id, Count: 1, Consumer: cfg.Consumer})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var pend []redis.XPendingExt
	for _, c := range cmds {
		pend = append(pend, c.Val()...)
	}
	return pend, nil
}

// dropIdleConsumers deletes the group's consumers idle past ConsumerTimeout with no
// pending entry (XGROUP DELCONSUMER of one with none loses nothing). Errors are logged:
// the next check tries again.
func (r *reader) dropIdleConsumers(ctx context.Context) {
	cfg := r.s.cfg
	consumers, err := cfg.Client.XInfoConsumers(ctx, r.stream, cfg.Group).Result()
	if err != nil {
		r.log.Warn().Err(err).Msg("listing the group's consumers failed")
		return
	}
	for _, c := range consumers {
		if c.Pending > 0 || c.Idle < cfg.ConsumerTimeout || c.Name == cfg.Consumer {
			continue
		}
		if err := cfg.Client.XGroupDelConsumer(ctx, r.stream, cfg.Group, c.Name).Err(); err != nil {
			r.log.Warn().Err(err).Str("idle_consumer", c.Name).Msg("deleting an idle consumer failed")
		}
	}
}

// deliver hands the message of m over and waits for its Ack (true) or the end of ctx
// (false: it stays pending). A Nack hands it over again after NackResendSleep, if its
// entry is still pending for this consumer (stillOurs). An entry
// that does not unmarshal is logged and left pending (a claim pass retries it). If ctx
// ends while no handler holds the message (not yet taken, or nacked), m goes back to
// the front of the read-ahead, which the end of the reader gives back to the group.
func (r *reader) deliver(ctx context.Context, m redis.XMessage) bool {
	msg, err := r.s.cfg.Unmarshaller.Unmarshal(m.Values)
	if err != nil {
		r.log.Error().Err(err).Str("message_id", m.ID).Msg("entry does not unmarshal; left pending")
		return true
	}
	for {
		mctx, cancel := context.WithCancel(ctx)
		msg.SetContext(mctx)
		select {
		case r.out <- msg:
		case <-ctx.Done():
			cancel()
			r.unpop(m)
			return false
		}
		select {
		case <-msg.Acked():
			cancel()
			r.s.acked(r, m.ID)
			return true
		case <-msg.Nacked():
			cancel()
			msg = msg.Copy()
			if !r.pause(ctx, r.s.cfg.NackResendSleep) {
				r.unpop(m)
				return false
			}
			if !r.stillOurs(ctx, m.ID) {
				r.s.ended(r, m.ID, false)
				return true
			}
		case <-ctx.Done():
			cancel()
			r.settleAtEnd(msg, m)
			return false
		}
	}
}

// settleAtEnd ends msg as its handler did by the time ctx ended: a select that sees
// the handler's word and the end at once picks either. Acked, its ack is sent (lost,
// the entry would stay pending, to run again); nacked, m goes back to the read-ahead,
// given back to the group at the end, as a nack seen first would.
func (r *reader) settleAtEnd(msg *message.Message, m redis.XMessage) {
	select {
	case <-msg.Acked():
		r.s.acked(r, m.ID)
	case <-msg.Nacked():
		r.unpop(m)
	default:
	}
}

// stillOurs reports whether the entry id of a nacked message is still pending for this
// consumer, so that its message may be handed over again. While it waited out
// NackResendSleep, another copy of the entry (a second claim's) may have ended it, or
// put it in a lock's line, which acked it, or another consumer may have claimed it: that
// copy is the live one. Handed over again, this stale copy would run the event beside
// it, or in its place with nothing pending to bring it back if this worker died. A
// check that fails keeps the old behaviour: the message is handed over again.
func (r *reader) stillOurs(ctx context.Context, id string) bool {
	cfg := r.s.cfg
	p, err := cfg.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: cfg.Group,
		Start: id, End: id, Count: 1, Consumer: cfg.Consumer}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.log.Debug().Err(err).Str("message_id", id).Msg("could not check that a nacked entry is still ours; handing it over again")
		return true
	}
	if len(p) == 0 {
		r.log.Info().Str("message_id", id).Msg("a nacked entry was acked or claimed elsewhere while it waited to be handed over again; not handing it over")
		return false
	}
	return true
}

// pause waits d, or until ctx ends (false).
func (r *reader) pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
