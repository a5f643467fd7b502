package subscriber_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/subscriber"
)

// TestDrainGivesBackAndUndrainReads: a subscriber drained while it handles a message
// and holds entries read ahead hands nothing more over, gives those entries back to
// the group (still pending, idle past MaxIdleTime, their delivery count unchanged, so
// another consumer's claim pass takes them), reads no new entry, and reports drained
// only once the running message is acked. Undrained, it reads again.
func TestDrainGivesBackAndUndrainReads(t *testing.T) {
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
	sub.Drain()
	redistest.Eventually(t, 5*time.Second, func() bool { return sub.ReadAhead(stream) == 0 }, "read-ahead given back")
	if sub.Drained() {
		t.Fatal("drained while a message runs")
	}
	later := add()
	pend := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Val()
	if len(pend) != 3 {
		t.Fatalf("pending %+v, want the 3 entries read (none given up, the new one not read)", pend)
	}
	for _, p := range pend[1:] {
		if p.Idle < maxIdle || p.RetryCount != 1 {
			t.Errorf("given back entry %s: idle %s, deliveries %d; want idle past %s, 1 delivery", p.ID, p.Idle, p.RetryCount, maxIdle)
		}
	}
	first.Ack()
	redistest.Eventually(t, 5*time.Second, sub.Drained, "drained once the running message is acked")
	select {
	case m := <-msgs:
		t.Fatalf("drained subscriber handed %s over", event.EntryID(m))
	case <-time.After(200 * time.Millisecond):
	}
	// Another consumer takes what was given back at once.
	// Its connections carry a name, so that the test can see when the server no longer
	// holds a read of it blocked (below).
	named := rdb.Options()
	named.ClientName = ns + "other"
	other := newSub(t, redis.NewClient(named), subscriber.Config{Consumer: "d", MaxIdleTime: maxIdle})
	omsgs, err := other.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 3 {
		m := receive(t, omsgs)
		got[event.EntryID(m)] = true
		m.Ack()
	}
	if !got[ids[1]] || !got[ids[2]] || !got[later] {
		t.Fatalf("other consumer got %v, want %s %s %s", got, ids[1], ids[2], later)
	}
	_ = other.Close()
	// A closed subscriber's last blocking read may still be registered on the server for
	// a moment (its connection's close not yet processed): an entry added then is
	// delivered to it, pending for "d" until a claim. Not this test's subject: wait for
	// the server to let go of it before the next entry is added.
	redistest.Eventually(t, 5*time.Second, func() bool { return !blockedClient(ctx, rdb, named.ClientName) },
		"the closed subscriber's read let go by the server")
	// Undrained, it reads again.
	sub.Undrain()
	if sub.Draining() || sub.Drained() {
		t.Fatal("still draining after Undrain")
	}
	// The closed subscriber's last read may still reach the server after that check (its
	// reader's read in flight when Close returned): the entry it reads is handed back
	// for a claim, which this subscriber (ClaimInterval 1h) does not make. So an entry is
	// added again, up to three times, until one is read: the undrained subscriber must
	// read the last one added.
	var m *message.Message
	var again string
	for try := 0; m == nil && try < 3; try++ {
		again = add()
		select {
		case m = <-msgs:
		case <-time.After(5 * time.Second):
			if p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: again, End: again, Count: 1}).Val(); len(p) == 0 || p[0].Consumer != "d" {
				t.Fatalf("undrained subscriber reads nothing (%s added; pending %+v)", again, p)
			}
		}
	}
	if m == nil || event.EntryID(m) != again {
		t.Fatalf("got %v, want %s", m, again)
	}
	m.Ack()
}

// TestDrainBeforeSubscribe: a subscriber drained before it subscribes reads nothing.
func TestDrainBeforeSubscribe(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream := ns + "s"
	msg, _ := event.New(event.TriageRequested, "RHEL-1", event.Task{}, nil)
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: event.Encode(msg)})
	sub := newSub(t, rdb, subscriber.Config{})
	sub.Drain()
	msgs, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, sub.Drained, "drained")
	select {
	case m := <-msgs:
		t.Fatalf("handed %s over while drained", event.EntryID(m))
	case <-time.After(300 * time.Millisecond):
	}
	if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 0 {
		t.Fatalf("%d entries read while drained", n)
	}
	sub.Undrain()
	receive(t, msgs).Ack()
}

// blockedClient reports whether a connection named name is blocked in a command on the
// server (CLIENT LIST flags b).
func blockedClient(ctx context.Context, rdb *redis.Client, name string) bool {
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return true
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+name+" ") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "flags=") && strings.Contains(f, "b") {
					return true
				}
			}
		}
	}
	return false
}
