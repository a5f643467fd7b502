package subscriber

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
)

// Defaults of Config's fields.
const (
	DefaultBlockTime     = 5 * time.Second
	DefaultClaimInterval = 5 * time.Second
	DefaultMaxIdleTime   = time.Minute
	DefaultClaimBatch    = 100
	DefaultAckDelay      = 5 * time.Millisecond
	DefaultKeepAhead     = 2
	// DefaultConsumerTimeout: as watermill-redisstream's subscriber did, consumers of the
	// group idle this long with nothing pending are deleted (checked every half of it),
	// so the names of gone pods do not pile up in the group.
	DefaultConsumerTimeout = 10 * time.Minute
)

// Unmarshaller turns a stream entry's fields into a message. event.Marshaller is one
// (so is watermill-redisstream's MarshallerUnmarshaller).
type Unmarshaller interface {
	Unmarshal(values map[string]any) (*message.Message, error)
}

// Observer hears of the read loop's steps. Its methods are called from the loop's own
// goroutine, never with a lock of the subscriber held, so they may call back into it.
type Observer interface {
	// Reading is called before an XREADGROUP is sent; the function it returns is called
	// once the read has returned.
	Reading() (done func())
	// Read is told of the entries read or claimed, stamped, in the order they will be
	// handed over, before the first of them is.
	Read(stream string, msgs []redis.XMessage)
	// Ended is told that the message of entry id was acked by its handler (its XACK is
	// queued, or skipped when settled), or that, nacked, it is not handed over again:
	// its entry was no longer pending for this consumer (a stale copy).
	Ended(stream, id string)
}

// Config configures New. Client, Group and Consumer are required; every other field
// has the default its comment states, taken when left zero.
type Config struct {
	// Client reads and acks. Close leaves it open. Required.
	Client redis.UniversalClient
	// Group is the consumer group, created at Subscribe from the stream's start ("0")
	// when missing. Required.
	Group string
	// Consumer is this subscriber's consumer name in the group. Required.
	Consumer string
	// Unmarshaller reads entries. Default: event.Marshaller{}.
	Unmarshaller Unmarshaller
	// BlockTime is how long one XREADGROUP waits for an entry; Close waits for the read
	// in flight. Default: 5s.
	BlockTime time.Duration
	// ClaimInterval is the time between two claim passes. Default: 5s.
	ClaimInterval time.Duration
	// MaxIdleTime is how long an entry stays pending before a claim pass may take it.
	// Default: 1m.
	MaxIdleTime time.Duration
	// ClaimBatch is the most entries one claim pass looks at. Default: 100.
	ClaimBatch int
	// ReadBatch is the most entries one XREADGROUP takes. Default: 1.
	ReadBatch int
	// KeepAhead is how many entries the loop keeps read ahead while a message is
	// handled: it reads again (up to ReadBatch) while fewer wait. The next entries are
	// then known before they are handed over (a lease taken ahead, the supersede
	// policy). Default: 2.
	KeepAhead int
	// BatchNow, when set, is asked before each read whether to take up to ReadBatch
	// entries (true) or one. Default: nil, always ReadBatch.
	BatchNow func() bool
	// ShouldClaim is the claim veto: asked about each entry idle past MaxIdleTime, only
	// those it allows are claimed. Default: nil, every one.
	ShouldClaim func(ctx context.Context, p redis.XPendingExt) bool
	// NackResendSleep is how long a nacked message waits before it is handed over
	// again. Default: 0, at once.
	NackResendSleep time.Duration
	// AckDelay bounds how long an XACK waits for the next read to ride with. Default:
	// 5ms.
	AckDelay time.Duration
	// ConsumerTimeout: consumers of the group idle this long with no pending entry are
	// deleted, checked every half of it. Default: 10m.
	ConsumerTimeout time.Duration
	// Observer hears of reads, claims and acks. Default: nil.
	Observer Observer
	// Logger receives the subscriber's lines. Default: the zero Logger, nothing.
	Logger zerolog.Logger
}

// ErrClosed is returned by Subscribe on a closed subscriber.
var ErrClosed = errors.New("subscriber: closed")

func (c *Config) defaults() error {
	var missing []string
	for _, f := range []struct {
		name  string
		unset bool
	}{{"Client", c.Client == nil}, {"Group", c.Group == ""}, {"Consumer", c.Consumer == ""}} {
		if f.unset {
			missing = append(missing, "Config."+f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("subscriber: %s required", strings.Join(missing, ", "))
	}
	for _, d := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{{"BlockTime", &c.BlockTime, DefaultBlockTime}, {"ClaimInterval", &c.ClaimInterval, DefaultClaimInterval},
		{"MaxIdleTime", &c.MaxIdleTime, DefaultMaxIdleTime}, {"AckDelay", &c.AckDelay, DefaultAckDelay},
		{"NackResendSleep", &c.NackResendSleep, 0}, {"ConsumerTimeout", &c.ConsumerTimeout, DefaultConsumerTimeout}} {
		if *d.d < 0 {
			return fmt.Errorf("subscriber: Config.%s must not be negative, got %s", d.name, *d.d)
		}
		if *d.d == 0 {
			*d.d = d.def
		}
	}
	// BLOCK 0 would wait for ever: a read must return for Close and the claim passes.
	c.BlockTime = max(c.BlockTime, time.Millisecond)
	if c.ClaimBatch < 0 || c.ReadBatch < 0 || c.KeepAhead < 0 {
		return fmt.Errorf("subscriber: Config.ClaimBatch, ReadBatch and KeepAhead must not be negative, got %d, %d and %d",
			c.ClaimBatch, c.ReadBatch, c.KeepAhead)
	}
	if c.ClaimBatch == 0 {
		c.ClaimBatch = DefaultClaimBatch
	}
	c.ReadBatch = max(c.ReadBatch, 1)
	if c.KeepAhead <= 0 {
		c.KeepAhead = DefaultKeepAhead
	}
	if c.Unmarshaller == nil {
		c.Unmarshaller = event.Marshaller{}
	}
	return nil
}

// Subscriber reads Redis streams as one consumer of a group. It implements
// message.Subscriber.
type Subscriber struct {
	cfg     Config
	closing chan struct{}
	loops   sync.WaitGroup // the handing-over loops
	acks    *acker

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex // guards the fields below and every reader's ahead and held
	closed  bool
	settled map[entryRef]struct{}
	readers []*reader
	drain   drainState // drain.go: read nothing new, give back what waits
}

// entryRef names one stream entry.
type entryRef struct{ stream, id string }

// New returns a subscriber; it reads nothing before Subscribe.
func New(cfg Config) (*Subscriber, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg, closing: make(chan struct{}), settled: map[entryRef]struct{}{}}
	s.acks = newAcker(cfg.Client, cfg.Group, cfg.AckDelay, cfg.Logger)
	return s, nil
}

// Subscribe creates the group on topic (the stream) if missing, from the stream's
// start, and returns the channel its messages come on, one at a time: the next is sent
// once the last is acked. The channel closes when ctx ends or the subscriber closes.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.loops.Add(1)
	s.mu.Unlock()
	if err := createGroup(ctx, s.cfg.Client, topic, s.cfg.Group); err != nil {
		s.loops.Done()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-rctx.Done():
		}
	}()
	out := make(chan *message.Message)
	r := &reader{s: s, stream: topic, out: out, claimFrom: "-",
		filled: make(chan struct{}, 1), drained: make(chan struct{}, 1),
		log: s.cfg.Logger.With().Str("stream", topic).Str("consumer", s.cfg.Consumer).Logger()}
	s.mu.Lock()
	s.readers = append(s.readers, r)
	s.mu.Unlock()
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		defer cancel() // fill stops only when reading cannot go on: so does run
		r.fill(rctx)
	}()
	ran := make(chan struct{})
	go func() {
		defer s.loops.Done()
		defer close(out)
		defer close(ran)
		defer cancel()
		r.run(rctx)
	}()
	go func() {
		<-rctx.Done()
		<-filled
		<-ran                 // run puts back a message it could not hand over, or one nacked
		r.giveBackAtEnd(true) // what a read in flight, or one whose reply was lost, brought
		s.drop(r)             // after run: Close gives back what is listed
	}()
	return out, nil
}

// alone reports whether r is the only reader of its stream.
func (s *Subscriber) alone(r *reader) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.readers {
		if x != r && x.stream == r.stream {
			return false
		}
	}
	return true
}

// drop forgets a reader whose loops have ended.
func (s *Subscriber) drop(r *reader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.readers {
		if x == r {
			s.readers = append(s.readers[:i], s.readers[i+1:]...)
			return
		}
	}
}

// createGroup creates group on stream from its start, and the stream if missing.
func createGroup(ctx context.Context, rdb redis.UniversalClient, stream, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("subscriber: create group %s on %s: %w", group, stream, err)
	}
	return nil
}

// Close stops handing messages over (one handed over and not acked stays pending;
// one acked or nacked by the time Close is called is acked, or given back),
// gives the entries read ahead back to the group (marked idle past MaxIdleTime, so any
// consumer's next claim pass takes them) and sends the acks still queued. It does not
// wait for a blocking read in flight (a cancelled context does not end one): that read
// returns within BlockTime, or at once when the client is closed, and what it read is
// given back then if the client is still open, else it stays pending for this
// consumer, for the next start-up or a claim pass after MaxIdleTime. The client stays
// open. Every call returns once the first is done, with its error.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.closing)
		s.mu.Unlock()
		s.loops.Wait()
		s.mu.Lock()
		readers := slices.Clone(s.readers)
		s.mu.Unlock()
		for _, r := range readers {
			r.giveBackAtEnd(false) // giving is fill's own, and fill may still read
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.closeErr = s.acks.stop(ctx)
	})
	return s.closeErr
}

// Settle tells the subscriber that the entry's XACK was sent by whoever ended its
// event (the lock middleware's release), or that it is not this consumer's: its ack
// sends none.
func (s *Subscriber) Settle(stream, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled[entryRef{stream, id}] = struct{}{}
}

// ReadAhead is the number of entries of stream read and not yet handed over.
func (s *Subscriber) ReadAhead(stream string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.readers {
		if r.stream == stream {
			n += len(r.ahead)
		}
	}
	return n
}

// HandBack forgets the entries of stream read and not yet handed over and returns
// their ids: they stay pending for this consumer, and the caller hands them to the
// group (GiveBack, for any consumer's claim pass). The reader reads no more until
// the message it handles now is acked.
func (s *Subscriber) HandBack(stream string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, r := range s.readers {
		if r.stream != stream || len(r.ahead) == 0 {
			continue
		}
		for _, m := range r.ahead {
			ids = append(ids, m.ID)
		}
		r.ahead, r.held = nil, true
	}
	return ids
}

// GiveBack makes the entries ids of stream, pending for this consumer, look idle past
// MaxIdleTime (XCLAIM to this consumer with IDLE, their delivery count unchanged), so
// that any consumer's next claim pass takes them. It is how the reader gives back its
// read-ahead (drain, end), and how a caller gives back what HandBack returned, or what
// an earlier run under this consumer's name left pending.
func (s *Subscriber) GiveBack(ctx context.Context, stream string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	idle := (s.cfg.MaxIdleTime + time.Second).Milliseconds()
	return s.cfg.Client.Do(ctx, s.claimArgs(stream, 0, ids, "IDLE", idle, "JUSTID")...).Err()
}

// claimArgs is an XCLAIM of ids of stream to this consumer, if idle for at least
// minIdle ms, with the options opts: the claim pass's, the give-back's and the
// recoveries' one spelling.
func (s *Subscriber) claimArgs(stream string, minIdle int64, ids []string, opts ...any) []any {
	args := make([]any, 0, 5+len(ids)+len(opts))
	args = append(args, "XCLAIM", stream, s.cfg.Group, s.cfg.Consumer, minIdle)
	for _, id := range ids {
		args = append(args, id)
	}
	return append(args, opts...)
}

// acked queues the XACK of a message its handler acked, unless it is settled.
func (s *Subscriber) acked(r *reader, id string) { s.ended(r, id, true) }

// ended is the end of the message of entry id handed over by r: acked (its XACK queued
// unless settled), or a stale copy not handed over again (stillOurs: nothing to send).
// Either way the reader may read on and the Observer hears that the entry ended.
func (s *Subscriber) ended(r *reader, id string, ack bool) {
	ref := entryRef{r.stream, id}
	s.mu.Lock()
	_, settled := s.settled[ref]
	delete(s.settled, ref)
	r.held = false
	r.busy = false
	s.mu.Unlock()
	signal(r.drained)
	if ack && !settled {
		s.acks.add(r.stream, id)
	}
	if s.cfg.Observer != nil {
		s.cfg.Observer.Ended(r.stream, id)
	}
}

// signal wakes the loop waiting on c, if any; c has room for one.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// stamp writes into each entry's fields its id, its stream and the read time, which
// the event format's Unmarshal moves into the message's metadata (event.EntryID,
// event.EntryStream, event.ReadAt).
func stamp(stream string, msgs []redis.XMessage, at time.Time) {
	now := strconv.FormatInt(at.UnixNano(), 10)
	for i := range msgs {
		if msgs[i].Values == nil {
			msgs[i].Values = map[string]any{}
		}
		msgs[i].Values[event.FieldEntryID] = msgs[i].ID
		msgs[i].Values[event.FieldEntryStream] = stream
		msgs[i].Values[event.FieldReadAt] = now
	}
}
