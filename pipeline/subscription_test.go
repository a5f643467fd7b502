package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// With nothing read ahead, Peek waits for the read in flight, so the middleware learns
// the next entry (and takes its lease in the release's round trip) instead of missing it.
func TestPeekWaitsForTheReadInFlight(t *testing.T) {
	// Not parallel: it times a blocked XREADGROUP against the peek that waits for it.
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rdb := srv.Client()
	opts, err := ClientOptions(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	route := event.Route{Stream: "s", Group: "g"}
	if err := rdb.XGroupCreateMkStream(ctx, route.Stream, route.Group, "$").Err(); err != nil {
		t.Fatal(err)
	}
	s, err := newSubscription(subscriptionConfig{Route: route, Consumer: "c", ClientOptions: opts, Shared: rdb,
		BlockTime: 3 * time.Second, MaxIdleTime: time.Minute, ClaimInterval: time.Minute, NackSleep: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.close() }()
	s.peekWait = 10 * time.Second // the test decides when the read returns, not a timer

	// The subscriber's first read blocks (BlockTime) on the empty stream.
	msgs, err := s.sub.Subscribe(ctx, route.Stream)
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.reading != nil
	}, "the read is in flight")
	type peeked struct {
		id string
		ok bool
	}
	got := make(chan peeked, 1)
	go func() {
		id, _, ok := s.Peek()
		got <- peeked{id, ok}
	}()
	select {
	case p := <-got:
		t.Fatalf("Peek answered (%q, %v) before the read returned", p.id, p.ok)
	case <-time.After(100 * time.Millisecond): // Peek must still be waiting
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: map[string]any{event.MetaPrefix + event.MetaIssueKey: "RHEL-1"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if !p.ok || p.id != id {
			t.Fatalf("Peek = (%q, %v), want the entry the read returned, %s", p.id, p.ok, id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Peek did not answer once the read returned")
	}
	select {
	case m := <-msgs:
		m.Ack()
	case <-time.After(5 * time.Second):
		t.Fatal("the entry read was not handed over")
	}
}

// A batch entry handed back to the group is left to other consumers while this one is
// busy (its own claim loop would queue it behind the long event again), and taken back
// by this one once it is idle (there may be no other consumer).
func TestOwnClaimLeavesHandedBackEntriesWhileBusy(t *testing.T) {
	t.Parallel()
	long := time.Now() // the long event's start
	s := &subscription{consumer: "c", inflight: map[string]struct{}{}, offered: map[string]time.Time{"1-1": long, "1-2": long}}
	s.started = long
	if !s.keepOffered("1-1") {
		t.Error("during the long event: this consumer's claim loop would take back an entry it handed to the group")
	}
	if s.keepOffered("2-1") {
		t.Error("an entry never handed back is vetoed")
	}
	s.finish()
	if s.keepOffered("1-1") {
		t.Error("idle: the entry it handed back is not taken back")
	}
	s.started = long.Add(time.Second) // busy again, with another event
	if s.keepOffered("1-2") {
		t.Error("busy with the next event: an entry handed back during the long one is never taken back by this consumer")
	}
	if len(s.offered) != 0 {
		t.Errorf("entries taken back are still listed as handed back: %v", s.offered)
	}
}

// A router stopped by cancelling its context closes its subscriptions' own Redis
// clients: nothing is left connected after Run returns.
func TestRouterStoppedByItsContextClosesItsClients(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	opts, err := ClientOptions(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lease.New(rdb, lease.Options{Scope: ns})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(RouterConfig{Client: rdb, ClientOptions: opts, Topology: event.Topology{Namespace: ns + "ymir"},
		Agent: "triage", Consumer: "w", BlockTime: 100 * time.Millisecond, MaxIdleTime: 200 * time.Second,
		ClaimInterval: 100 * time.Millisecond, Locker: locker, Handler: func(*message.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Running():
	case <-time.After(10 * time.Second):
		t.Fatal("router did not start")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("router: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("router did not stop")
	}
	for _, s := range r.subs {
		if err := s.client.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
			t.Errorf("subscription %s: its client still answers (%v) after Run returned", s.route.Stream, err)
		}
	}
	_ = r.Close()
}

// The claim veto spares an idle entry that a live lease guards, and only that one: the
// :todo twin's entry of the same id (the two streams' ids repeat) is another event, and
// is claimed (it was left to wait for the other's run to end).
func TestClaimVetoSparesOnlyTheGuardedStreamsEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	topo := event.Topology{Namespace: ns + "ymir"}
	locker, err := lease.New(rdb, lease.Options{Scope: ns})
	if err != nil {
		t.Fatal(err)
	}
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-1"}}`))
	msg, _ := event.New(event.TriageRequested, "RHEL-1", task, nil)
	main, todo := topo.Stream("triage", "", false), topo.Stream("triage", "", true)
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: main, Values: event.Encode(msg)}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: todo, ID: id, Values: event.Encode(msg)}).Err(); err != nil {
		t.Fatal(err)
	}
	le, err := locker.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: id, Stream: main})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	for _, c := range []struct {
		stream string
		claim  bool
	}{{main, false}, {todo, true}} {
		s := &subscription{route: event.Route{Agent: "triage", Stream: c.stream}, consumer: "c2", shared: rdb, locker: locker,
			inflight: map[string]struct{}{}, offered: map[string]time.Time{}}
		if got := s.shouldClaim(ctx, redis.XPendingExt{ID: id, Consumer: "c1"}); got != c.claim {
			t.Errorf("entry %s of %s: claimed %v, want %v", id, c.stream, got, c.claim)
		}
	}
}
