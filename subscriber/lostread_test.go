package subscriber_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/subscriber"
)

// A read whose reply is lost (the connection cut after Redis had delivered its
// entries to this consumer) is not sent again by go-redis: it fails, and the
// subscriber then takes the entries that read delivered, at once and in
// order, their delivery count still 1, instead of leaving them to a claim pass after
// MaxIdleTime (an hour here).
func TestLostReadReplyIsRecovered(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = addTriage(ctx, t, rdb, stream)
	}
	proxy := redistest.NewLossyProxy(t, rdb.Options().Addr)
	opts := *rdb.Options()
	opts.Addr = proxy.Addr() // go-redis's retries on, as in a worker
	client := redis.NewClient(&opts)
	t.Cleanup(func() { _ = client.Close() })
	proxy.LoseReply(redistest.Command("XREADGROUP"), 1)
	sub, err := subscriber.New(subscriber.Config{Client: client, Group: "g", Consumer: "c", Unmarshaller: event.Marshaller{},
		BlockTime: 50 * time.Millisecond, MaxIdleTime: time.Hour, ReadBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	var got []*redis.XPendingExt
	for i, id := range ids {
		m := receive(t, msgs)
		if event.EntryID(m) != id {
			t.Fatalf("message %d is entry %s, want %s", i, event.EntryID(m), id)
		}
		p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id, End: id, Count: 1}).Val()
		if len(p) != 1 {
			t.Fatalf("entry %s not pending while handled", id)
		}
		got = append(got, &p[0])
		m.Ack()
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("%d replies lost, want the first read's", proxy.Cuts())
	}
	for _, p := range got {
		if p.Consumer != "c" || p.RetryCount != 1 {
			t.Fatalf("recovered entry %+v: want consumer c, delivered once", *p)
		}
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return rdb.XPending(ctx, stream, "g").Val().Count == 0 },
		"the recovered entries acked")
}
