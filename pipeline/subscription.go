package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// subscription is one watermill-redisstream Subscriber reading one stream as one
// consumer, with the fixes of docs/architecture.md, "Living with watermill-redisstream",
// around it. It implements lockmw.Source.
type subscription struct {
	route    event.Route
	consumer string
	client   redis.UniversalClient // its own: Subscriber.Close closes it
	shared   redis.UniversalClient // locks, claim checks
	locker   *lease.Locker
	sub      *redisstream.Subscriber
	log      zerolog.Logger

	runnable  func(values map[string]any) bool // see subscriptionConfig.Runnable
	readBatch int64                            // most entries one XREADGROUP takes (1: as Watermill asks)
	peekWait  time.Duration                    // see defaultPeekWait
	maxIdle   time.Duration                    // RouterConfig.MaxIdleTime: an entry idle this long may be claimed
	offerTime time.Duration                    // see defaultOfferAfter

	mu       sync.Mutex
	inflight map[string]struct{}  // delivered to this process, not yet acked
	settled  map[string]struct{}  // acked by the middleware, or not ours: skip the XACK
	queue    []queued             // read, not yet handed to the middleware, in read order
	ready    []redis.XStream      // read by a batched XREADGROUP, not yet given to the reader
	reading  chan struct{}        // closed when the XREADGROUP in flight returns; nil if none
	readFrom time.Time            // when it was sent
	offered  map[string]time.Time // batch entries handed back: the long event's start
	offerer  *time.Timer          // hands the batch back when the event being handled runs long
	offerAt  time.Time            // when offerer fires; zero when it is not armed
	started  time.Time            // when the middleware took the entry it handles now
	handled  time.Duration        // how long the last finished entry took, start to ack
	finished time.Time            // when it finished
}

// Read batching. Watermill's reader asks for one entry per XREADGROUP, so a backlog
// costs a round trip per event for the read alone. While this subscription gets through
// its entries quickly (the last one finished less than fastHandling after it started,
// and less than a second ago), the read hook asks Redis for up to ReadBatch entries and
// answers the reader's next calls from them, with no round trip. A slow handler, or
// the first event after a quiet spell, keeps reads at one entry, so a batch does not
// sit here behind a long run while other consumers are free; entries that do wait
// long are covered like the read-ahead ones (ownership check before running).
const fastHandling = 20 * time.Millisecond

// defaultOfferAfter: when the event being handled has run this long and entries of a
// batch still wait here, they are handed back to the group (marked idle, so any
// consumer's next claim pass takes them), and this consumer's own claim loop leaves
// them alone while it is busy. A batch thus waits behind a long run (quick events, then
// an agent run) for about this plus ClaimInterval, not MaxIdleTime.
const defaultOfferAfter = time.Second

// queued is an entry read and not yet handed to the middleware. values are its stream
// fields, kept to decide once (check, at Peek or Waiting) whether the dead-letter path
// will take it.
type queued struct {
	id, issueKey, eventType string
	values                  map[string]any
	checked                 bool
}

// The event format's Marshaller is the subscribers' unmarshaller.
var _ redisstream.MarshallerUnmarshaller = event.Marshaller{}

type subscriptionConfig struct {
	Route         event.Route
	Consumer      string
	ClientOptions *redis.UniversalOptions
	Shared        redis.UniversalClient
	Locker        *lease.Locker
	BlockTime     time.Duration
	MaxIdleTime   time.Duration
	ClaimInterval time.Duration
	NackSleep     time.Duration
	MaxEventBytes int
	ReadBatch     int
	Logger        zerolog.Logger
	// Runnable reports whether an entry's fields make an event that reaches the lease
	// (the dead-letter middleware's Validate passes). Peek names no issue for one that
	// does not, so no lease is taken ahead for a bad event. Nil: every entry.
	Runnable func(values map[string]any) bool
}

func newSubscription(cfg subscriptionConfig) (*subscription, error) {
	s := &subscription{
		route:     cfg.Route,
		consumer:  cfg.Consumer,
		client:    redis.NewUniversalClient(cfg.ClientOptions),
		shared:    cfg.Shared,
		locker:    cfg.Locker,
		log:       cfg.Logger.With().Str("stream", cfg.Route.Stream).Str("consumer", cfg.Consumer).Logger(),
		inflight:  map[string]struct{}{},
		settled:   map[string]struct{}{},
		runnable:  cfg.Runnable,
		readBatch: int64(max(cfg.ReadBatch, 1)),
		peekWait:  defaultPeekWait,
		maxIdle:   cfg.MaxIdleTime,
		offerTime: defaultOfferAfter,
		offered:   map[string]time.Time{},
	}
	s.client.AddHook(s)
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        s.client,
		Unmarshaller:                  event.Marshaller{MaxEventBytes: cfg.MaxEventBytes},
		Consumer:                      cfg.Consumer,
		ConsumerGroup:                 cfg.Route.Group,
		NackResendSleep:               cfg.NackSleep,
		BlockTime:                     cfg.BlockTime,
		ClaimInterval:                 cfg.ClaimInterval,
		MaxIdleTime:                   cfg.MaxIdleTime,
		ShouldClaimPendingMessage:     s.shouldClaim,
		DisableIndefiniteInitialBlock: true,
		// A read error (Redis restarting) must not end the subscription: retry. Only
		// our own shutdown ends it, at once.
		ShouldStopOnReadErrors: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
		},
	}, newWatermillLogger(s.log))
	if err != nil {
		_ = s.client.Close()
		return nil, err
	}
	s.sub = sub
	return s, nil
}

// prepare creates the group and re-marks this consumer's own pending entries (left by
// a previous run under the same name) as idle, so the subscriber's first claim pass
// takes them at once instead of after MaxIdleTime.
func (s *subscription) prepare(ctx context.Context) (int, error) {
	err := s.shared.XGroupCreateMkStream(ctx, s.route.Stream, s.route.Group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return 0, fmt.Errorf("create group %s on %s: %w", s.route.Group, s.route.Stream, err)
	}
	marked := 0
	start := "-"
	for {
		pend, err := s.shared.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s.route.Stream, Group: s.route.Group,
			Start: start, End: "+", Count: 500, Consumer: s.consumer}).Result()
		if err != nil {
			return marked, fmt.Errorf("list own pending entries of %s: %w", s.route.Stream, err)
		}
		if len(pend) == 0 {
			return marked, nil
		}
		ids := make([]string, len(pend))
		for i, p := range pend {
			ids[i] = p.ID
		}
		if err := s.markIdle(ctx, ids); err != nil {
			return marked, fmt.Errorf("re-mark own pending entries of %s: %w", s.route.Stream, err)
		}
		marked += len(pend)
		if len(pend) < 500 {
			return marked, nil
		}
		start = "(" + pend[len(pend)-1].ID
	}
}

// markIdle re-marks entries this consumer owns as idle past MaxIdleTime (XCLAIM to
// itself, IDLE, JUSTID), so the next claim pass of any consumer may take them.
func (s *subscription) markIdle(ctx context.Context, ids []string) error {
	args := make([]any, 0, 8+len(ids))
	args = append(args, "XCLAIM", s.route.Stream, s.route.Group, s.consumer, 0)
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, "IDLE", (s.maxIdle + time.Second).Milliseconds(), "JUSTID")
	return s.shared.Do(ctx, args...).Err()
}

// shouldClaim is the claim veto: an idle entry is claimed only when no live lease
// guards it. Entries this process holds (in flight or in the read-ahead buffer) are
// never claimed back from ourselves.
func (s *subscription) shouldClaim(xp redis.XPendingExt) bool {
	if xp.Consumer == s.consumer && (s.isInflight(xp.ID) || s.keepOffered(xp.ID)) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	msgs, err := s.shared.XRangeN(ctx, s.route.Stream, xp.ID, xp.ID, 1).Result()
	if err != nil {
		s.log.Warn().Err(err).Str("message_id", xp.ID).Msg("claim veto: cannot read entry; not claiming it now")
		return false
	}
	if len(msgs) == 0 {
		return true // trimmed: the subscriber acks it away
	}
	msg := event.DecodeEntry(s.route.Stream, xp.ID, msgs[0].Values)
	key, err := issueKeyOf(msg)
	if err != nil || key == "" {
		return true // a bad event: let it be claimed and dead-lettered
	}
	info, held, err := s.locker.Inspect(ctx, s.route.Agent, key)
	if err != nil {
		if errors.Is(err, lease.ErrInvalidKey) {
			return true
		}
		s.log.Warn().Err(err).Str("message_id", xp.ID).Msg("claim veto: cannot inspect lease; not claiming it now")
		return false
	}
	if held && info.MessageID == xp.ID {
		s.log.Debug().Str("message_id", xp.ID).Str("issue_key", info.Issue).Str("holder", info.Owner).
			Msg("claim veto: a live lease guards this entry")
		return false
	}
	return true
}

// keepOffered reports whether id is a batch entry this consumer handed back while the
// long event it waited behind still runs: other consumers are to take it. Once that
// event is over, this consumer's own claim loop may take it back (there may be no
// other consumer).
func (s *subscription) keepOffered(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	during, ok := s.offered[id]
	if !ok {
		return false
	}
	if s.started.Equal(during) {
		return true
	}
	delete(s.offered, id)
	return false
}

// armOffer arms the timer for when the event handled now will have run offerTime, if
// entries of a batch wait behind it. Called with s.mu held.
func (s *subscription) armOffer() {
	if len(s.ready) == 0 || s.started.IsZero() || s.maxIdle <= 0 {
		return
	}
	due := s.started.Add(s.offerTime)
	if !s.offerAt.IsZero() && !s.offerAt.After(due) {
		return // it fires sooner, and re-arms for this event then: no timer change per event
	}
	s.offerAt = due
	if s.offerer == nil {
		s.offerer = time.AfterFunc(time.Until(due), s.offerBack)
		return
	}
	s.offerer.Reset(time.Until(due))
}

// offerBack hands the entries still waiting in the batch back to the group when the
// event being handled has run offerTime: they are marked idle past MaxIdleTime (as a
// restart's start-up pass does), so other consumers' claim passes take them.
func (s *subscription) offerBack() {
	s.mu.Lock()
	s.offerAt = time.Time{}
	if s.started.IsZero() || len(s.ready) == 0 {
		s.mu.Unlock()
		return
	}
	if time.Since(s.started) < s.offerTime { // armed for an earlier event
		s.armOffer()
		s.mu.Unlock()
		return
	}
	for id, during := range s.offered {
		if !during.Equal(s.started) { // claimed elsewhere, or taken back
			delete(s.offered, id)
		}
	}
	ids := make([]string, 0, len(s.ready))
	for _, x := range s.ready {
		for _, m := range x.Messages {
			ids = append(ids, m.ID)
			s.offered[m.ID] = s.started
			delete(s.inflight, m.ID)
			s.dequeue(m.ID)
		}
	}
	clear(s.ready)
	s.ready = s.ready[:0]
	s.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.markIdle(ctx, ids); err != nil {
		// They stay pending here, unhandled until this consumer's claim loop or another's
		// takes them after MaxIdleTime: late, not lost.
		s.log.Warn().Err(err).Int("entries", len(ids)).Msg("could not hand read-ahead entries back to the group")
		return
	}
	s.log.Info().Int("entries", len(ids)).Dur("running_for", s.offerTime).
		Msg("the event being handled runs long: handed the entries read ahead with it back to the group")
}

// stopOffers stops the hand-back timer (the router has stopped).
func (s *subscription) stopOffers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.offerer != nil {
		s.offerer.Stop()
	}
}

func (s *subscription) isInflight(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.inflight[id]
	return ok
}

// Entry implements lockmw.Source.
func (s *subscription) Entry(msg *message.Message) (lockmw.Entry, bool) {
	id := event.EntryID(msg)
	if id == "" {
		return lockmw.Entry{}, false
	}
	e := lockmw.Entry{Stream: s.route.Stream, Group: s.route.Group, Consumer: s.consumer, ID: id}
	if at, ok := event.ReadAt(msg); ok {
		e.ReadAt = at
	}
	s.mu.Lock()
	s.dequeue(id)
	s.started = time.Now()
	s.armOffer()
	s.mu.Unlock()
	return e, true
}

// Settle implements lockmw.Source.
func (s *subscription) Settle(e lockmw.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled[e.ID] = struct{}{}
	delete(s.inflight, e.ID)
	s.dequeue(e.ID)
	s.finish()
}

// finish records how long the entry handled now took. Called with s.mu held.
func (s *subscription) finish() {
	if s.started.IsZero() {
		return
	}
	s.finished = time.Now()
	s.handled, s.started = s.finished.Sub(s.started), time.Time{}
}

// Encode implements lockmw.Source.
func (s *subscription) Encode(msg *message.Message) (map[string]any, error) {
	return event.Encode(msg), nil
}

// DialHook implements redis.Hook.
func (s *subscription) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook implements redis.Hook.
func (s *subscription) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ProcessHook stamps read entries with their id and read time, and skips the XACK of
// entries already settled by the lock middleware.
func (s *subscription) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c, ok := cmd.(*redis.IntCmd); ok && cmd.Name() == "xack" {
			if n, skip := s.skipAck(cmd.Args()); skip {
				c.SetVal(n)
				return nil
			}
			err := next(ctx, cmd)
			if err == nil {
				s.forget(cmd.Args())
			}
			return err
		}
		if c, ok := cmd.(*redis.XStreamSliceCmd); ok && cmd.Name() == "xreadgroup" {
			return s.read(ctx, next, c)
		}
		err := next(ctx, cmd)
		if err != nil {
			return err
		}
		now := strconv.FormatInt(time.Now().UnixNano(), 10)
		switch c := cmd.(type) {
		case *redis.XStreamSliceCmd:
			for _, st := range c.Val() {
				s.stamp(st.Stream, st.Messages, now)
			}
		case *redis.XMessageSliceCmd:
			if cmd.Name() == "xclaim" && len(cmd.Args()) > 1 {
				s.stamp(fmt.Sprint(cmd.Args()[1]), c.Val(), now)
			}
		}
		return nil
	}
}

// read answers the Watermill reader's XREADGROUP (one entry asked for): with an entry
// an earlier batched read took, else from Redis, asking for up to readBatch entries
// while this subscription keeps up (see fastHandling). Every entry read is stamped and
// counted in flight at once, so Peek sees it and the claim veto spares it.
func (s *subscription) read(ctx context.Context, next redis.ProcessHook, c *redis.XStreamSliceCmd) error {
	s.mu.Lock()
	if len(s.ready) > 0 {
		x := s.ready[0]
		s.ready[0] = redis.XStream{}
		s.ready = s.ready[1:]
		s.mu.Unlock()
		c.SetVal([]redis.XStream{x})
		return nil
	}
	batch := s.readBatch > 1 && s.handled > 0 && s.handled < fastHandling && time.Since(s.finished) < time.Second
	reading := make(chan struct{})
	s.reading, s.readFrom = reading, time.Now()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.reading = nil
		s.mu.Unlock()
		close(reading)
	}()
	if batch {
		setCount(c.Args(), s.readBatch)
	}
	if err := next(ctx, c); err != nil {
		return err
	}
	val := c.Val()
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	for _, st := range val {
		s.stamp(st.Stream, st.Messages, now)
	}
	if len(val) != 1 || len(val[0].Messages) < 2 {
		return nil
	}
	st := val[0]
	s.mu.Lock()
	for _, m := range st.Messages[1:] {
		s.ready = append(s.ready, redis.XStream{Stream: st.Stream, Messages: []redis.XMessage{m}})
	}
	s.armOffer()
	s.mu.Unlock()
	c.SetVal([]redis.XStream{{Stream: st.Stream, Messages: st.Messages[:1]}})
	return nil
}

// setCount sets the COUNT of an XREADGROUP's arguments (as go-redis builds them:
// ... "count", n, ...) to n.
func setCount(args []any, n int64) {
	for i := 0; i+1 < len(args); i++ {
		if a, ok := args[i].(string); ok && strings.EqualFold(a, "count") {
			args[i+1] = n
			return
		}
	}
}

func (s *subscription) stamp(stream string, msgs []redis.XMessage, now string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range msgs {
		if msgs[i].Values == nil {
			msgs[i].Values = map[string]any{}
		}
		msgs[i].Values[event.FieldEntryID] = msgs[i].ID
		msgs[i].Values[event.FieldEntryStream] = stream
		msgs[i].Values[event.FieldReadAt] = now
		s.inflight[msgs[i].ID] = struct{}{}
		key, _ := msgs[i].Values[event.MetaPrefix+event.MetaIssueKey].(string)
		et, _ := msgs[i].Values[event.MetaPrefix+event.MetaEventType].(string)
		s.queue = append(s.queue, queued{id: msgs[i].ID, issueKey: key, eventType: et, values: msgs[i].Values})
	}
}

// Waiting lists the entries read ahead and not yet handed over, without waiting (the
// supersede policy: a newer event for the issue of the run under way, read ahead by
// this very subscription, cancels it rather than waiting behind it).
func (s *subscription) Waiting() []lockmw.Waiting {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil
	}
	w := make([]lockmw.Waiting, 0, len(s.queue))
	for i := range s.queue {
		q := &s.queue[i]
		// Only events the handler chain would run: a bad one is dead-lettered when
		// handed over, so it has no standing to supersede a run.
		if s.check(q); q.issueKey != "" {
			w = append(w, lockmw.Waiting{ID: q.id, IssueKey: q.issueKey, EventType: q.eventType})
		}
	}
	return w
}

// check decides, once per entry, whether it makes an event that reaches the lease: the
// validation the dead-letter middleware applies when the entry is handed over
// (subscriptionConfig.Runnable). It forgets the issue of one that does not, so neither
// Peek (a lease taken ahead) nor Waiting (a supersede) acts on it. Called with s.mu
// held.
func (s *subscription) check(q *queued) {
	if q.checked {
		return
	}
	q.checked = true
	if q.issueKey != "" && s.runnable != nil && !s.runnable(q.values) {
		q.issueKey = ""
	}
	q.values = nil
}

// defaultPeekWait is how long Peek waits for a read that was sent this recently: a read
// that finds entries answers within a round trip, one on an empty stream blocks
// BlockTime.
const defaultPeekWait = time.Millisecond

// Peek implements lockmw.Peeker: the entry handed over next, as far as this process
// knows (its read order). With nothing read ahead but a read sent less than peekWait
// ago, it waits for that read (at most peekWait): the next lease is then taken in the
// release's round trip instead of a round trip of its own.
func (s *subscription) Peek() (id, issueKey string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 && s.reading != nil {
		if wait := s.peekWait - time.Since(s.readFrom); wait > 0 {
			reading := s.reading
			s.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-reading:
			case <-t.C:
			}
			t.Stop()
			s.mu.Lock()
		}
	}
	if len(s.queue) == 0 {
		return "", "", false
	}
	// A bad event never reaches the lease, so a lease taken ahead for it would only sit
	// there, making the issue look busy to every other consumer until given back.
	q := &s.queue[0]
	s.check(q)
	return q.id, q.issueKey, true
}

// dequeue forgets id as waiting (it was handed to the middleware or settled). Called
// with s.mu held.
func (s *subscription) dequeue(id string) {
	for i, q := range s.queue {
		if q.id == id {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
}

// skipAck reports whether every id of an XACK (args: xack stream group id...) was
// settled already, and forgets them.
func (s *subscription) skipAck(args []any) (int64, bool) {
	if len(args) < 4 {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range args[3:] {
		if _, ok := s.settled[idArg(a)]; !ok {
			return 0, false
		}
	}
	for _, a := range args[3:] {
		delete(s.settled, idArg(a))
		delete(s.inflight, idArg(a))
	}
	return int64(len(args) - 3), true
}

func (s *subscription) forget(args []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range args[min(3, len(args)):] {
		delete(s.inflight, idArg(a))
		s.dequeue(idArg(a))
	}
	s.finish()
}

// idArg is an entry id passed to a command (a string, as go-redis keeps it).
func idArg(a any) string {
	if s, ok := a.(string); ok {
		return s
	}
	return fmt.Sprint(a)
}
