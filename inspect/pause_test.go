package inspect_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// TestPauseParksAndResumeRunsInOrder drives a real triage router with the pause check
// (RouterConfig.Pauses): a run under way when agent:triage is paused with
// --stop-running is stopped (its lease force-released) and its event parks; the events
// published during the pause are not run and wait in the pause's line, acked, nothing
// pending; resume appends them again in stream order and each runs once.
func TestPauseParksAndResumeRunsInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	locker := e.TriageLocker(3 * time.Second)
	in := e.inspector(nil, 0)
	var mu sync.Mutex
	var ran []string
	started := make(chan string, 20)
	h := func(msg *message.Message) error {
		key := msg.Metadata.Get(event.MetaIssueKey)
		started <- key
		if key == "RHEL-1" && msg.Metadata.Get("parked_from") == "" {
			<-msg.Context().Done() // the first run hangs until it is stopped
			return msg.Context().Err()
		}
		mu.Lock()
		ran = append(ran, key)
		mu.Unlock()
		return nil
	}
	cfg := e.Config("triage", "", "w1", locker, h)
	cfg.Pauses = locker.Pauses()
	pipelinetest.Start(ctx, t, cfg)
	e.PublishTriage("RHEL-1")
	if k := <-started; k != "RHEL-1" {
		t.Fatalf("first run %s", k)
	}
	op := audit.WithOperator(ctx, audit.Operator{Who: "alice", From: "test", Reason: "maintenance"})
	p, err := in.Pause(op, "agent:triage", true)
	if err != nil || len(p.Stopped) != 1 || p.Stopped[0].Issue != "RHEL-1" {
		t.Fatalf("pause --stop-running: %+v %v", p, err)
	}
	for _, k := range []string{"RHEL-2", "RHEL-3", "RHEL-4"} {
		e.PublishTriage(k)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		ps, err := in.Pauses(ctx)
		return err == nil && len(ps) == 1 && ps[0].Waiting == 4
	}, "the stopped event and the three new ones parked")
	if n := e.Client.XPending(ctx, e.TriageStream(), "triage").Val().Count; n != 0 {
		t.Errorf("%d entries pending while parked, want 0 (acked when parked)", n)
	}
	mu.Lock()
	if len(ran) != 0 {
		t.Errorf("ran during the pause: %v", ran)
	}
	mu.Unlock()
	r, err := in.Resume(op, "agent:triage")
	if err != nil || !r.Found || r.Published != 4 {
		t.Fatalf("resume: %+v %v", r, err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 4 }, "the four events run")
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(ran, []string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-4"}) {
		t.Errorf("ran %v, want the stream order", ran)
	}
}
