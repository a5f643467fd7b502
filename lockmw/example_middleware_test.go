package lockmw_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A plain Watermill handler, fed by a stock watermill-redisstream subscriber, runs each
// message under its issue's lease: the middleware canonicalises the key it finds in the
// message's "issue_key" metadata, takes the lease (with a fence), runs the handler with
// the lease's context and releases it before the message is acked. An event for an issue
// held by another worker is acked and dropped.
//
// Without a Source (here nil) the middleware only locks. pipeline.NewRouter passes its
// own subscription as the Source, which also keeps a long job's entry from being claimed
// by another consumer and acks in the release's round trip.
func ExampleNewMiddleware() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts, _ := redis.ParseURL(redistest.URL())
	rdb := redis.NewClient(opts) // leases and publishing
	defer rdb.Close()
	ns := redistest.Namespace() // keeps the example's keys apart; omit in real use
	defer redistest.DeleteNamespace(context.Background(), rdb, ns)
	stream := ns + "triage"

	// A subscriber closes the client it is given, so it gets its own.
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{Client: redis.NewClient(opts),
		ConsumerGroup: "triage", Consumer: "worker-1"}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	locker, err := lease.New(rdb, lease.Options{Scope: ns, Owner: "worker-1"})
	if err != nil {
		panic(err)
	}
	locks, err := lockmw.NewMiddleware(lockmw.Config{Locker: locker, Agent: "triage"})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	h := router.AddConsumerHandler("triage", stream, sub, func(msg *message.Message) error {
		le, _ := lockmw.LeaseFrom(msg.Context())
		// Do the work with le.Context(): it is cancelled if the lease is lost.
		fmt.Println("working on", msg.Metadata.Get(event.MetaIssueKey), "with fence", le.Fence())
		close(done)
		return nil
	})
	h.AddMiddleware(locks.Handler)
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: rdb}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata.Set(event.MetaIssueKey, " rhel-123 ")
	if err := pub.Publish(stream, msg); err != nil {
		panic(err)
	}
	<-done
	_ = router.Close()
	locks.Close(ctx)
	// Output: working on RHEL-123 with fence 1
}
