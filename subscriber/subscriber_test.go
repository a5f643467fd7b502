package subscriber_test

import (
	"context"
	"testing"
	"time"

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
