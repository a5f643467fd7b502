package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/subscriber"
)

// subscription is one subscriber.Subscriber reading one stream as one consumer, with
// the pipeline's view of what it read ahead (docs/architecture.md, "The read path"):
// the claim veto, the lease taken ahead (Peek), the supersede policy (Waiting) and the
// hand-back of a batch waiting behind a long event. It implements lockmw.Source and
// subscriber.Observer.
type subscription struct {
	route    event.Route
	consumer string
	client   redis.UniversalClient // its own, for the blocking reads: closed by close
	shared   redis.UniversalClient // locks, claim checks
	locker   *lease.Locker
	sub      *subscriber.Subscriber
	log      zerolog.Logger

	runnable  func(values map[string]any) bool // see subscriptionConfig.Runnable
	readBatch int64                            // most entries one XREADGROUP takes (1: no batching)
	peekWait  time.Duration                    // see defaultPeekWait
	maxIdle   time.Duration                    // RouterConfig.MaxIdleTime: an entry idle this long may be claimed
	offerTime time.Duration                    // see defaultOfferAfter

	mu       sync.Mutex
	inflight map[string]struct{}  // read by this process, not yet ended
	queue    []queued             // read, not yet handed to the middleware, in read order
	reading  chan struct{}        // closed when the XREADGROUP in flight returns; nil if none
	readFrom time.Time            // when it was sent
	offered  map[string]time.Time // batch entries handed back: the long event's start
	offerer  *time.Timer          // hands the batch back when the event being handled runs long
	offerAt  time.Time            // when offerer fires; zero when it is not armed
	started  time.Time            // when the middleware took the entry it handles now
	handled  time.Duration        // how long the last finished entry took, start to ack
	finished time.Time            // when it finished
}

// Read batching. While this subscription gets through its entries quickly (the last
// one finished less than fastHandling after it started, and less than a second ago),
// its subscriber reads up to ReadBatch entries per XREADGROUP and hands them over one
// by one with no round trip (BatchNow). A slow handler, or the first event after a
// quiet spell, keeps reads at one entry, so a batch does not sit here behind a long run
// while other consumers are free; entries that do wait long are covered like the
// read-ahead ones (ownership check before running).
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
		runnable:  cfg.Runnable,
		readBatch: int64(max(cfg.ReadBatch, 1)),
		peekWait:  defaultPeekWait,
		maxIdle:   cfg.MaxIdleTime,
		offerTime: defaultOfferAfter,
		offered:   map[string]time.Time{},
	}
	sub, err := subscriber.New(subscriber.Config{
		Client:          s.client,
		Group:           cfg.Route.Group,
		Consumer:        cfg.Consumer,
		Unmarshaller:    event.Marshaller{MaxEventBytes: cfg.MaxEventBytes},
		BlockTime:       cfg.BlockTime,
		ClaimInterval:   cfg.ClaimInterval,
		MaxIdleTime:     cfg.MaxIdleTime,
		ReadBatch:       int(s.readBatch),
		BatchNow:        s.batchNow,
		ShouldClaim:     s.shouldClaim,
		NackResendSleep: cfg.NackSleep,
		Observer:        s,
		Logger:          cfg.Logger, // the subscriber names the stream and consumer itself
	})
	if err != nil {
		_ = s.client.Close()
		return nil, err
	}
	s.sub = sub
	return s, nil
}

// close stops the subscriber (it sends the acks it still holds) and closes its client.
// It is idempotent.
func (s *subscription) close() error {
	err := s.sub.Close()
	if cerr := s.client.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
		err = errors.Join(err, cerr)
	}
	return err
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
		if err := s.sub.GiveBack(ctx, s.route.Stream, ids); err != nil {
			return marked, fmt.Errorf("re-mark own pending entries of %s: %w", s.route.Stream, err)
		}
		marked += len(pend)
		if len(pend) < 500 {
			return marked, nil
		}
		start = "(" + pend[len(pend)-1].ID
	}
}

// shouldClaim is the claim veto: an idle entry is claimed only when no live lease
// guards it. Entries this process holds (in flight or in the read-ahead buffer) are
// never claimed back from ourselves.
func (s *subscription) shouldClaim(ctx context.Context, xp redis.XPendingExt) bool {
	if xp.Consumer == s.consumer && (s.isInflight(xp.ID) || s.keepOffered(xp.ID)) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msgs, err := s.shared.XRangeN(ctx, s.route.Stream, xp.ID, xp.ID, 1).Result()
	if err != nil {
		s.log.Warn().Err(err).Str("message_id", xp.ID).Msg("claim veto: cannot read entry; not claiming it now")
		return false
	}
	if len(msgs) == 0 {
		return true // trimmed: XCLAIM drops it from the pending list
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
	if held && info.Guards(s.route.Stream, xp.ID) {
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
	if s.started.IsZero() || s.maxIdle <= 0 || s.sub.ReadAhead(s.route.Stream) == 0 {
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
	if s.started.IsZero() || s.sub.ReadAhead(s.route.Stream) == 0 {
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
	ids := s.sub.HandBack(s.route.Stream)
	for _, id := range ids {
		s.offered[id] = s.started
		delete(s.inflight, id)
		s.dequeue(id)
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.sub.GiveBack(ctx, s.route.Stream, ids); err != nil {
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

// Origin implements lockmw.Origin: the route's stream and group.
func (s *subscription) Origin() (stream, group string) { return s.route.Stream, s.route.Group }

// Settle implements lockmw.Source: the middleware ended the entry's event and sent its
// XACK (in the release's round trip), or the entry is not ours; the subscriber sends
// none.
func (s *subscription) Settle(e lockmw.Entry) {
	s.sub.Settle(e.Stream, e.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
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

// batchNow tells the subscriber whether to read a batch now (see fastHandling).
func (s *subscription) batchNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readBatch > 1 && s.handled > 0 && s.handled < fastHandling && time.Since(s.finished) < time.Second
}

// Reading implements subscriber.Observer: Peek may wait for the read in flight.
func (s *subscription) Reading() func() {
	reading := make(chan struct{})
	s.mu.Lock()
	s.reading, s.readFrom = reading, time.Now()
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.reading = nil
		s.mu.Unlock()
		close(reading)
	}
}

// Read implements subscriber.Observer: every entry read (or claimed) counts in flight
// at once, so the claim veto spares it, and waits in the queue Peek and Waiting look
// at.
func (s *subscription) Read(_ string, msgs []redis.XMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range msgs {
		s.inflight[msgs[i].ID] = struct{}{}
		key, _ := msgs[i].Values[event.MetaPrefix+event.MetaIssueKey].(string)
		et, _ := msgs[i].Values[event.MetaPrefix+event.MetaEventType].(string)
		s.queue = append(s.queue, queued{id: msgs[i].ID, issueKey: key, eventType: et, values: msgs[i].Values})
	}
	s.armOffer()
}

// Ended implements subscriber.Observer: the entry's message was acked.
func (s *subscription) Ended(_, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, id)
	s.dequeue(id)
	s.finish()
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
	if len(s.queue) == 0 || s.sub.Draining() { // drained: what waits goes back to the group
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
