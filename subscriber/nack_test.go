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

// A nacked message is handed over again only while its entry is still pending for this
// consumer. Acked meanwhile (another copy of the entry ended it, or a lock's line took
// it) or claimed by another consumer, its copy here is stale: the next entry comes
// instead, and the Observer hears that the entry ended (the pipeline counts it in
// flight until then: a stale copy never ended held the reader up for good). Still
// pending, it comes back (the retry).
func TestNackedMessageComesBackOnlyWhileItsEntryIsOurs(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		taken func(stream, id string)
	}{
		{"pending", nil},
		{"acked", func(stream, id string) { rdb.XAck(ctx, stream, "g", id) }},
		{"claimed elsewhere", func(stream, id string) {
			rdb.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: "g", Consumer: "other", Messages: []string{id}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stream := ns + tc.name
			first, next := addTriage(ctx, t, rdb, stream), addTriage(ctx, t, rdb, stream)
			ends := newTally()
			sub := newSub(t, rdb, subscriber.Config{NackResendSleep: 50 * time.Millisecond, Observer: ends})
			msgs, err := sub.Subscribe(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			m := receive(t, msgs)
			if event.EntryID(m) != first {
				t.Fatalf("got %s first, want %s", event.EntryID(m), first)
			}
			// Taken while its handler still holds it: the reader asks after the nack's
			// sleep, whatever the machine's load.
			if tc.taken != nil {
				tc.taken(stream, first)
			}
			m.Nack()
			m = receive(t, msgs)
			want := first
			if tc.taken != nil {
				want = next
			}
			if event.EntryID(m) != want {
				t.Fatalf("after the nack got %s, want %s (first %s, next %s)", event.EntryID(m), want, first, next)
			}
			m.Ack()
			redistest.Eventually(t, 10*time.Second, func() bool { return ends.endedTimes(first) > 0 },
				"the Observer to hear that %s ended", first)
		})
	}
}
