package event_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
)

// Publishing an event over MaxEventBytes or MaxEventFields is refused with an error
// that says why; nothing is written.
func TestPublishRefusesOversizedEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-5","blob":"` + strings.Repeat("y", 5000) + `"}}`))
	msg, err := event.New(event.TriageRequested, "RHEL-5", task, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := event.NewPublisher(e.rdb, 0).WithMaxEventBytes(4096)
	if _, err := pub.PublishID(ctx, e.triage(), msg); !errors.Is(err, event.ErrEventTooLarge) ||
		!strings.Contains(err.Error(), "at most 4096") {
		t.Fatalf("oversized publish: %v", err)
	}
	small, _ := event.New(event.TriageRequested, "RHEL-5", event.Task{}, nil)
	for i := range event.MaxEventFields {
		small.Metadata.Set("f"+strconv.Itoa(i), "v")
	}
	if _, err := pub.PublishID(ctx, e.triage(), small); !errors.Is(err, event.ErrEventTooLarge) ||
		!strings.Contains(err.Error(), "fields") {
		t.Fatalf("wide publish: %v", err)
	}
	if n, _ := e.rdb.XLen(ctx, e.triage()).Result(); n != 0 {
		t.Fatalf("%d entries written", n)
	}
}

// PublishOnce: a second publish with the same once id to the same stream (a webhook's
// redelivery of one comment) adds nothing and returns the first entry's id; another
// stream or another id is another entry; an empty id is refused.
func TestPublishOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pub := event.NewPublisher(e.rdb, 0)
	msg := func() *message.Message {
		m, err := event.New(event.CommentCreated, "RHEL-1", event.Task{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, err := pub.PublishOnce(ctx, e.triage(), msg(), "comment:10", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pub.PublishOnce(ctx, e.triage(), msg(), "comment:10", time.Minute)
	if err != nil || b != a {
		t.Fatalf("repeat: %s %v, want %s", b, err, a)
	}
	c, _ := pub.PublishOnce(ctx, e.triage(), msg(), "comment:11", time.Minute)
	todo := e.topo.Stream("triage", "", true)
	d, _ := pub.PublishOnce(ctx, todo, msg(), "comment:10", time.Minute)
	if c == a || d == "" || e.rdb.XLen(ctx, e.triage()).Val() != 2 || e.rdb.XLen(ctx, todo).Val() != 1 {
		t.Fatalf("entries: %s %s %s", a, c, d)
	}
	if _, err := pub.PublishOnce(ctx, e.triage(), msg(), "", time.Minute); err == nil {
		t.Fatal("an empty once id was accepted")
	}
}
