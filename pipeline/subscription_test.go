package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// With nothing read ahead, Peek waits for the read in flight, so the middleware learns
// the next entry (and takes its lease in the release's round trip) instead of missing it.
func TestPeekWaitsForTheReadInFlight(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rdb := srv.Client()
	opts, err := ClientOptions(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	route := Route{Stream: "s", Group: "g"}
	if err := rdb.XGroupCreateMkStream(ctx, route.Stream, route.Group, "$").Err(); err != nil {
		t.Fatal(err)
	}
	s, err := newSubscription(subscriptionConfig{Route: route, Consumer: "c", ClientOptions: opts, Shared: rdb,
		BlockTime: time.Second, MaxIdleTime: time.Minute, ClaimInterval: time.Minute, NackSleep: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.client.Close()
	s.peekWait = 10 * time.Second // the test decides when the read returns, not a timer

	read := make(chan error, 1)
	go func() {
		read <- s.client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{"s", ">"},
			Count: 1, Block: 10 * time.Second}).Err()
	}()
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
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: map[string]any{metaPrefix + MetaIssueKey: "RHEL-1"}}).Result()
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
	if err := <-read; err != nil {
		t.Fatal(err)
	}
}
