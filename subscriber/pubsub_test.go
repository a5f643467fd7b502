package subscriber_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/subscriber"
)

// features are what the subscriber supports, as Watermill's universal Pub/Sub tests
// know them (docs/architecture.md, "The read path", lists the same with why):
var features = tests.Features{
	ConsumerGroups: true,
	// At least once: a message handed over and not acked before its consumer stops (a
	// crash, a Close) stays pending and is handed over again, to a claim pass. Runs are
	// made exclusive by the lease, not by the transport.
	ExactlyOnceDelivery: false,
	// In read order for one subscriber, which hands one message over at a time (the
	// next once the last is acked: TestNoAck). Not across the consumers of a group,
	// which share the stream, and not for an entry a claim pass takes (older, handed
	// over after newer ones): GuaranteedOrderWithSingleSubscriber makes the in-order
	// test use one subscriber.
	GuaranteedOrder:                     true,
	GuaranteedOrderWithSingleSubscriber: true,
	Persistent:                          true,
	// A new consumer group starts at the stream's start ("0").
	NewSubscriberReceivesOldMessages: true,
	// A stream entry carries no Go context.
	ContextPreserved: false,
	// TestReconnect needs a command that restarts the broker: the suite shares one
	// Redis with every other test, which must not be restarted under them, and the test
	// publishes 10 000 messages. pipeline's TestRedisRestartMidRunLosesNothing restarts
	// a redis-server of its own under this subscriber instead.
	RestartServiceCommand: nil,
	// The short variants (50 to 100 messages a test): the suite stays within minutes.
	ForceShort: true,
}

// Watermill's universal Pub/Sub tests, on the real Redis in a namespace of their own:
// published with watermill-redisstream's Publisher and our wire format (event.Marshaller).
func TestUniversalPubSub(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	f := features
	f.GenerateTopicFunc = func(tc tests.TestContext) string { return ns + "topic-" + string(tc.TestID) }
	tests.TestPubSub(t, f, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return pubSub(t, rdb, event.Marshaller{}, watermill.NewShortUUID())
	}, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return pubSub(t, rdb, event.Marshaller{}, group)
	})
}

// The same tests with watermill-redisstream's own marshaller on the publishing side
// (metadata as one msgpack field): entries a stock publisher writes are read.
func TestUniversalPubSubStockMarshaller(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	f := features
	f.GenerateTopicFunc = func(tc tests.TestContext) string { return ns + "stock-" + string(tc.TestID) }
	tests.TestPubSub(t, f, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return pubSub(t, rdb, redisstream.DefaultMarshallerUnmarshaller{}, watermill.NewShortUUID())
	}, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return pubSub(t, rdb, redisstream.DefaultMarshallerUnmarshaller{}, group)
	})
}

// pubSub is a publisher (watermill-redisstream's, writing with m) and one of our
// subscribers on a client of its own (its blocking reads hold a connection each), with
// short timings: the universal tests wait up to 15 s per step.
func pubSub(t *testing.T, rdb *redis.Client, m redisstream.Marshaller, group string) (message.Publisher, message.Subscriber) {
	// Each its own client: a Publisher's Close closes its client (the tests close it,
	// some after they return: it is not closed here), and the subscriber's blocking
	// reads hold a connection each.
	pubClient, client := redis.NewClient(rdb.Options()), redis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = client.Close() })
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: pubClient, Marshaller: m}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var log zerolog.Logger
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	}
	sub, err := subscriber.New(subscriber.Config{Client: client, Group: group, Consumer: watermill.NewShortUUID(), Logger: log,
		BlockTime: 50 * time.Millisecond, ClaimInterval: time.Second, MaxIdleTime: 2 * time.Second, ReadBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() }) // before its client is closed; waits for a Close under way
	return pub, sub
}
