package subscriber_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/subscriber"
)

// TestCloseGivesBackReadAhead: a subscriber that closes while it holds entries read
// ahead gives them back to the group (pending, idle past MaxIdleTime, delivered once),
// so another consumer's first claim pass takes them rather than one MaxIdleTime later.
func TestCloseGivesBackReadAhead(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	add := func() string { return addTriage(ctx, t, rdb, stream) }
	ids := []string{add(), add(), add()}
	maxIdle := time.Minute
	sub := newSub(t, rdb, subscriber.Config{ReadBatch: 10, KeepAhead: 3, MaxIdleTime: maxIdle, ClaimInterval: time.Hour})
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	first := receive(t, msgs)
	redistest.Eventually(t, 5*time.Second, func() bool { return sub.ReadAhead(stream) == 2 }, "the other two read ahead")
	first.Ack()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	checkGivenBack(ctx, t, rdb, stream, maxIdle, ids[1:])
	other := newSub(t, rdb, subscriber.Config{Consumer: "d", MaxIdleTime: maxIdle})
	omsgs, err := other.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range ids[1:] {
		m := receive(t, omsgs)
		if got := event.EntryID(m); got != want {
			t.Fatalf("other consumer got %s, want %s", got, want)
		}
		m.Ack()
	}
}

// TestCloseGivesBackWhatAReadInFlightBrings: an entry that a blocking read in flight at
// Close brings in is given back once the read returns (the client still open).
func TestCloseGivesBackWhatAReadInFlightBrings(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	maxIdle := time.Minute
	named := rdb.Options()
	named.ClientName = ns + "closing"
	sub := newSub(t, redis.NewClient(named), subscriber.Config{BlockTime: 20 * time.Second, MaxIdleTime: maxIdle, ClaimInterval: time.Hour})
	if _, err := sub.Subscribe(ctx, stream); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClient(ctx, rdb, named.ClientName) }, "the read blocked on the server")
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	id := addTriage(ctx, t, rdb, stream)
	checkGivenBack(ctx, t, rdb, stream, maxIdle, []string{id})
}

// checkGivenBack waits until exactly ids are pending in group g, each idle past maxIdle
// and delivered once.
func checkGivenBack(ctx context.Context, t *testing.T, rdb *redis.Client, stream string, maxIdle time.Duration, ids []string) {
	t.Helper()
	var pend []redis.XPendingExt
	given := func() bool {
		pend = rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Val()
		if len(pend) != len(ids) {
			return false
		}
		for i, p := range pend {
			if p.ID != ids[i] || p.Idle < maxIdle || p.RetryCount != 1 {
				return false
			}
		}
		return true
	}
	if !redistest.Within(5*time.Second, given) {
		t.Fatalf("pending %+v; want %v given back: idle past %s, delivered once", pend, ids, maxIdle)
	}
}

// addTriage appends a triage event of RHEL-1 to stream and returns its entry id.
func addTriage(ctx context.Context, t *testing.T, rdb *redis.Client, stream string) string {
	t.Helper()
	msg, err := event.New(event.TriageRequested, "RHEL-1", event.Task{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestHandlersWordJustBeforeCloseCounts: a message acked just before Close has its
// XACK sent, and one nacked just before it is given back to the group, even when the
// reader sees the handler's word and the close at once (CI once lost an ack that way,
// and the entry stayed pending, to run again). Many rounds: the moment is a race.
func TestHandlersWordJustBeforeCloseCounts(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	maxIdle := time.Minute
	for i := range 100 {
		stream := fmt.Sprintf("%ss%d", ns, i)
		id := addTriage(ctx, t, rdb, stream)
		sub := newSub(t, rdb, subscriber.Config{MaxIdleTime: maxIdle, ClaimInterval: time.Hour})
		msgs, err := sub.Subscribe(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		m := receive(t, msgs)
		if i%2 == 1 {
			m.Nack()
			if err := sub.Close(); err != nil {
				t.Fatal(err)
			}
			checkGivenBack(ctx, t, rdb, stream, maxIdle, []string{id})
			continue
		}
		m.Ack()
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 0 {
			t.Fatalf("round %d: %d entries pending after an ack and Close; want 0", i, n)
		}
	}
}
