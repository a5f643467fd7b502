package subscriber_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/subscriber"
)

// newSub is a subscriber on its own client with short timings.
func newSub(t *testing.T, rdb *redis.Client, cfg subscriber.Config) *subscriber.Subscriber {
	t.Helper()
	client := redis.NewClient(rdb.Options())
	cfg.Client = client
	if cfg.Group == "" {
		cfg.Group = "g"
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "c"
	}
	if cfg.BlockTime == 0 {
		cfg.BlockTime = 50 * time.Millisecond
	}
	if testing.Verbose() {
		cfg.Logger = zerolog.New(zerolog.NewTestWriter(t))
	}
	sub, err := subscriber.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sub.Close()
		_ = client.Close()
	})
	return sub
}

// receive takes the next message or fails.
func receive(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
		return nil
	}
}

// Each entry is handed over stamped with its id, its stream and the read time, and
// its ack removes it from the group's pending list.
func TestReadsStampsAndAcks(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	msg, err := event.New(event.TriageRequested, "RHEL-1", event.Task{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)}).Val()
	sub := newSub(t, rdb, subscriber.Config{})
	before := time.Now()
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	got := receive(t, msgs)
	if event.EntryID(got) != id || event.EntryStream(got) != stream || got.UUID != msg.UUID {
		t.Fatalf("got entry %q of %q, uuid %q; want %q of %q, uuid %q", event.EntryID(got), event.EntryStream(got), got.UUID, id, stream, msg.UUID)
	}
	if at, ok := event.ReadAt(got); !ok || at.Before(before) || at.After(time.Now()) {
		t.Fatalf("read time %v (%v), want between %v and now", at, ok, before)
	}
	got.Ack()
	redistest.Eventually(t, 5*time.Second, func() bool {
		return rdb.XPending(ctx, stream, "g").Val().Count == 0
	}, "the entry is acked")
}

// Entries stay compatible both ways: one a stock watermill-redisstream publisher
// writes (metadata as one msgpack field) is read by this subscriber, and one written
// in the readable form (event.Marshaller) by a stock watermill-redisstream subscriber,
// with the same UUID, payload and metadata.
func TestEntriesCompatibleWithStockWatermillBothWays(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	sent := message.NewMessage("uuid-1", []byte(`{"x":1}`))
	sent.Metadata.Set(event.MetaIssueKey, "RHEL-1")
	sent.Metadata.Set("test", "value")
	same := func(t *testing.T, got *message.Message) {
		t.Helper()
		if got.UUID != sent.UUID || string(got.Payload) != string(sent.Payload) {
			t.Fatalf("got %s %q, want %s %q", got.UUID, got.Payload, sent.UUID, sent.Payload)
		}
		for k, v := range sent.Metadata {
			if got.Metadata.Get(k) != v {
				t.Fatalf("metadata %s = %q, want %q", k, got.Metadata.Get(k), v)
			}
		}
	}

	t.Run("stock publisher, our subscriber", func(t *testing.T) {
		stream := ns + "in"
		pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(rdb.Options())}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		if err := pub.Publish(stream, sent); err != nil {
			t.Fatal(err)
		}
		if rdb.XRange(ctx, stream, "-", "+").Val()[0].Values["metadata"] == nil {
			t.Fatal("the stock publisher wrote no msgpack metadata field: the test proves nothing")
		}
		msgs, err := newSub(t, rdb, subscriber.Config{}).Subscribe(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		got := receive(t, msgs)
		same(t, got)
		got.Ack()
	})

	t.Run("our wire format, stock subscriber", func(t *testing.T) {
		stream := ns + "out"
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(sent)}).Err(); err != nil {
			t.Fatal(err)
		}
		stock, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{Client: redis.NewClient(rdb.Options()),
			Unmarshaller: event.Marshaller{}, Consumer: "c", ConsumerGroup: "g", BlockTime: 50 * time.Millisecond,
			DisableIndefiniteInitialBlock: true}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		defer stock.Close()
		msgs, err := stock.Subscribe(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		got := receive(t, msgs)
		same(t, got)
		got.Ack()
	})
}

// An entry settled (acked by whoever ended its event) gets no XACK of the
// subscriber's; the others' acks are sent together, with the next read.
func TestSettledEntriesAreNotAckedAgain(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	var ids []string
	for i := range 3 {
		msg := message.NewMessage(watermill.NewShortUUID(), []byte(strconv.Itoa(i)))
		ids = append(ids, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)}).Val())
	}
	counter := &xackCounter{}
	client := redis.NewClient(rdb.Options())
	client.AddHook(counter) // a test's own client: counts the XACKs sent
	defer client.Close()
	sub, err := subscriber.New(subscriber.Config{Client: client, Group: "g", Consumer: "c",
		BlockTime: 50 * time.Millisecond, AckDelay: time.Hour}) // acks ride with reads only
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		got := receive(t, msgs)
		if i == 1 {
			// The middleware acks it in its release round trip, then settles it.
			if err := rdb.XAck(ctx, stream, "g", ids[1]).Err(); err != nil {
				t.Fatal(err)
			}
			sub.Settle(stream, ids[1])
		}
		got.Ack()
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		return rdb.XPending(ctx, stream, "g").Val().Count == 0
	}, "every entry is acked")
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	for _, a := range counter.acked() {
		if a == ids[1] {
			t.Fatalf("the settled entry %s was acked by the subscriber too (XACKs: %v)", ids[1], counter.acked())
		}
	}
	if n := len(counter.acked()); n != 2 {
		t.Fatalf("the subscriber acked %d entries, want 2: %v", n, counter.acked())
	}
}

// xackCounter records the ids of the XACKs a client sends.
type xackCounter struct {
	mu  sync.Mutex
	ids []string
}

func (c *xackCounter) acked() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.ids...)
}

func (c *xackCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *xackCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.record(cmd)
		return next(ctx, cmd)
	}
}

func (c *xackCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *xackCounter) record(cmd redis.Cmder) {
	if cmd.Name() != "xack" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range cmd.Args()[3:] {
		c.ids = append(c.ids, a.(string))
	}
}

// The claim pass takes an entry idle past MaxIdleTime from another consumer only when
// the veto allows it.
func TestClaimPassAsksTheVeto(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	ids := readBy(ctx, t, rdb, stream, "dead", 2) // a consumer that died holding both
	var mu sync.Mutex
	asked := map[string]int{}
	sub := newSub(t, rdb, subscriber.Config{Consumer: "live", MaxIdleTime: 50 * time.Millisecond, ClaimInterval: 50 * time.Millisecond,
		ShouldClaim: func(_ context.Context, p redis.XPendingExt) bool {
			mu.Lock()
			defer mu.Unlock()
			asked[p.ID]++
			return p.ID == ids[1] // a live lease guards ids[0]
		}})
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	got := receive(t, msgs)
	if event.EntryID(got) != ids[1] {
		t.Fatalf("claimed %s, want %s (the veto refused %s)", event.EntryID(got), ids[1], ids[0])
	}
	got.Ack()
	redistest.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return asked[ids[0]] >= 3
	}, "three claim passes refused by the veto")
	pend := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Val()
	if len(pend) != 1 || pend[0].ID != ids[0] || pend[0].Consumer != "dead" {
		t.Fatalf("pending %v, want only %s, still the dead consumer's", pend, ids[0])
	}
}

// Consumers of the group idle past ConsumerTimeout with nothing pending are deleted;
// one with a pending entry stays.
func TestIdleConsumersAreDeleted(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"gone", "holding"} {
		if err := rdb.XGroupCreateConsumer(ctx, stream, "g", c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	msg := message.NewMessage(watermill.NewShortUUID(), nil)
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)})
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "holding", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	sub := newSub(t, rdb, subscriber.Config{Consumer: "live", ConsumerTimeout: 100 * time.Millisecond, MaxIdleTime: time.Hour})
	if _, err := sub.Subscribe(ctx, stream); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		names := map[string]bool{}
		for _, c := range rdb.XInfoConsumers(ctx, stream, "g").Val() {
			names[c.Name] = true
		}
		return !names["gone"] && names["holding"]
	}, "the idle consumer without pending entries is deleted, the one holding an entry stays")
}

// GiveBack hands entries pending for this consumer to the group: they look idle past
// MaxIdleTime, their delivery count unchanged, and another consumer's first claim
// pass takes them.
func TestGiveBackLetsAnotherConsumerClaim(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	ids := readBy(ctx, t, rdb, stream, "a", 3)
	a := newSub(t, rdb, subscriber.Config{Consumer: "a", MaxIdleTime: time.Hour, Unmarshaller: event.Marshaller{}})
	if err := a.GiveBack(ctx, stream, ids); err != nil {
		t.Fatal(err)
	}
	checkGivenBack(ctx, t, rdb, stream, time.Hour, ids)
	b := newSub(t, rdb, subscriber.Config{Consumer: "b", MaxIdleTime: time.Hour, ClaimInterval: 20 * time.Millisecond,
		Unmarshaller: event.Marshaller{}})
	msgs, err := b.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for range ids {
		receive(t, msgs).Ack()
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return rdb.XPending(ctx, stream, "g").Val().Count == 0 },
		"consumer b to ack what a gave back")
}

// readBy creates group g on stream, appends n entries and reads them as consumer: they
// are pending for it. It returns their ids.
func readBy(ctx context.Context, t *testing.T, rdb *redis.Client, stream, consumer string, n int) []string {
	t.Helper()
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		msg := message.NewMessage(watermill.NewShortUUID(), []byte(strconv.Itoa(i)))
		ids = append(ids, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)}).Val())
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: consumer, Streams: []string{stream, ">"}, Count: int64(n)}).Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}
