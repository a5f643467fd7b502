package event_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/pipeline/event"
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
