package subscriber_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/subscriber"
)

// A read of new entries (XREADGROUP) or a claim pass's XCLAIM whose reply is lost
// (the connection cut after Redis had delivered its entries to this consumer) is not
// sent again by go-redis: sent again, the read would return newer entries and the
// claim would find its entries no longer idle and take none. It fails, and the
// subscriber takes the entries it delivered at once and in order, their delivery count
// as it left it (a read: 1; a claim: 2, a read by a consumer gone, then the claim),
// instead of leaving them ours unseen until a claim pass after MaxIdleTime (an hour).
func TestLostReplyIsRecovered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		lose      redistest.Match
		gone      bool // a consumer that is gone read the entries an hour ago
		delivered int64
	}{
		{"read", redistest.Command("XREADGROUP"), false, 1},
		{"claim", claimPass, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newLostReply(t)
			if tc.gone {
				l.goneFor(t, time.Hour+time.Second)
			}
			l.proxy.LoseReply(tc.lose, 1)
			_, msgs := l.subscribe(t)
			l.checkRecovered(t, msgs, tc.delivered)
		})
	}
}

// A subscriber closed while it waits to take what a claim whose reply was lost took
// gives those entries back at its end (idle past MaxIdleTime, for any consumer's
// next claim pass), as it does its read-ahead, instead of leaving them ours unseen.
func TestLostClaimAtCloseIsGivenBack(t *testing.T) {
	t.Parallel()
	l := newLostReply(t)
	sub, _ := l.claimLost(t)
	if err := sub.Close(); err != nil { // within the pause after the failed claim
		t.Fatal(err)
	}
	// The end of a reader gives back after Close returns (as for a read in flight).
	var msg string
	givenBack := func() bool {
		for _, p := range l.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: l.stream, Group: "g",
			Start: "-", End: "+", Count: 10}).Val() {
			if p.Idle < time.Hour {
				msg = fmt.Sprintf("entry %s is pending for %s, idle %s: claimed and never given back", p.ID, p.Consumer, p.Idle)
				return false
			}
		}
		return true
	}
	if !redistest.Within(3*time.Second, givenBack) {
		t.Fatal(msg)
	}
}

// lostReply is a stream with a group g and three entries, and a client to it through
// a proxy that loses replies.
type lostReply struct {
	rdb, client *redis.Client
	proxy       *redistest.LossyProxy
	stream      string
	ids         []string
}

func newLostReply(t *testing.T) *lostReply {
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := &lostReply{rdb: rdb, stream: ns + "s", ids: make([]string, 3)}
	if err := rdb.XGroupCreateMkStream(ctx, l.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range l.ids {
		l.ids[i] = addTriage(ctx, t, rdb, l.stream)
	}
	l.proxy = redistest.NewLossyProxy(t, rdb.Options().Addr)
	opts := *rdb.Options()
	opts.Addr = l.proxy.Addr() // go-redis's retries on, as in a worker
	l.client = redis.NewClient(&opts)
	t.Cleanup(func() { _ = l.client.Close() })
	return l
}

// goneFor has a consumer that is gone read the entries, idle since d.
func (l *lostReply) goneFor(t *testing.T, d time.Duration) {
	ctx := context.Background()
	if err := l.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "gone", Streams: []string{l.stream, ">"},
		Count: int64(len(l.ids))}).Err(); err != nil {
		t.Fatal(err)
	}
	args := []any{"XCLAIM", l.stream, "g", "gone", 0}
	for _, id := range l.ids {
		args = append(args, id)
	}
	if err := l.rdb.Do(ctx, append(args, "IDLE", d.Milliseconds(), "JUSTID")...).Err(); err != nil {
		t.Fatal(err)
	}
}

// claimLost starts consumer c on entries a gone consumer read an hour ago, and returns
// once the reply of its first claim pass's XCLAIM was lost: the subscriber then waits
// retryWait before it takes what that claim took.
func (l *lostReply) claimLost(t *testing.T) (*subscriber.Subscriber, <-chan *message.Message) {
	l.goneFor(t, time.Hour+time.Second)
	l.proxy.LoseReply(claimPass, 1)
	sub, msgs := l.subscribe(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return l.proxy.Cuts() == 1 }, "the claim's reply lost")
	return sub, msgs
}

// subscribe starts consumer c on the proxy's client, MaxIdleTime an hour.
func (l *lostReply) subscribe(t *testing.T) (*subscriber.Subscriber, <-chan *message.Message) {
	sub, err := subscriber.New(subscriber.Config{Client: l.client, Group: "g", Consumer: "c", Unmarshaller: event.Marshaller{},
		BlockTime: 50 * time.Millisecond, MaxIdleTime: time.Hour, ReadBatch: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), l.stream)
	if err != nil {
		t.Fatal(err)
	}
	return sub, msgs
}

// checkRecovered checks that the three entries are handed over in order, each
// pending for c with delivery count want while handled, that one reply was lost,
// and that the acks land.
func (l *lostReply) checkRecovered(t *testing.T, msgs <-chan *message.Message, want int64) {
	t.Helper()
	ctx := context.Background()
	for i, id := range l.ids {
		m := receive(t, msgs)
		if event.EntryID(m) != id {
			t.Fatalf("message %d is entry %s, want %s", i, event.EntryID(m), id)
		}
		p := l.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: l.stream, Group: "g", Start: id, End: id, Count: 1}).Val()
		if len(p) != 1 {
			t.Fatalf("entry %s not pending while handled", id)
		}
		if p[0].Consumer != "c" || p[0].RetryCount != want {
			t.Fatalf("recovered entry %+v: want consumer c, delivered %d times", p[0], want)
		}
		m.Ack()
	}
	if l.proxy.Cuts() != 1 {
		t.Fatalf("%d replies lost, want one", l.proxy.Cuts())
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return l.rdb.XPending(ctx, l.stream, "g").Val().Count == 0 },
		"the recovered entries acked")
}

// A client closed under the subscriber while it waits to take what a claim whose
// reply was lost took ends the read loop (its channel closes), as a closed client does
// for a read, rather than a warning every retryWait for ever.
func TestLostClaimThenClientClosedEndsTheLoop(t *testing.T) {
	t.Parallel()
	l := newLostReply(t)
	_, msgs := l.claimLost(t)
	_ = l.client.Close() // within the pause after the failed claim
	select {
	case m, ok := <-msgs:
		if ok {
			t.Fatalf("entry %s handed over on a closed client", event.EntryID(m))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the read loop goes on with its client closed")
	}
}
