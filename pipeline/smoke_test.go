package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
)

func TestEventRunsOnceAndIsAcked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	var fence string
	e.start(ctx, routerOpts{}, func(msg *message.Message) error {
		if _, ok := lockmw.LeaseFrom(msg.Context()); !ok {
			t.Error("handler has no lease in its context")
		}
		fence = msg.Metadata.Get("fence")
		r.Add(issueOf(msg))
		return nil
	})
	e.publishTriage("rhel-1")
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-1") == 1 }, "one run")
	redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "entry acked")
	if fence == "" {
		t.Fatal("no fence in metadata")
	}
}
