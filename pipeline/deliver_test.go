package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
)

// Issue 24 items 1 and 2: under the deliver policy, events for an issue whose lease is
// held reach the holder's mailbox (acked, a lock.delivered record each) up to the bound;
// the rest are dead-lettered with the reason; the run accounts for some; the others
// start exactly one next run, which finds them.
func TestDeliverFollowupsToTheRun(t *testing.T) {
	// Not parallel: the next run is waited for within a bound, and the absence of a third run takes a pause to see.
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const depth, burst = 20, 30
	var r runs
	var mu sync.Mutex
	var seen [][]string // per run: the mailbox ids it found
	handler := func(msg *message.Message) error {
		n := r.Add(issueOf(msg))
		le, ok := lockmw.LeaseFrom(msg.Context())
		if !ok {
			return fmt.Errorf("no lease")
		}
		if n == 1 {
			redistest.Eventually(t, 20*time.Second, func() bool {
				return len(e.results(event.LockDelivered))+len(e.dead()) >= burst
			}, "the burst delivered or dead-lettered")
		}
		fu, err := le.Mailbox(msg.Context(), "", 0)
		if err != nil {
			return err
		}
		var ids []string
		for _, f := range fu {
			ids = append(ids, f.ID)
		}
		mu.Lock()
		seen = append(seen, ids)
		mu.Unlock()
		if n == 1 { // the first run accounts for half of them
			ids = ids[:len(ids)/2]
		}
		_, err = le.MailboxDone(msg.Context(), ids...)
		return err
	}
	for i := range 2 {
		e.start(ctx, routerOpts{Consumer: fmt.Sprintf("w%d", i), Policy: lockmw.Deliver, MailboxDepth: depth}, handler)
	}
	e.publishTriage("RHEL-5")
	redistest.Eventually(t, 5*time.Second, func() bool { return r.Get("RHEL-5") == 1 }, "first run")
	for range burst {
		e.publishTriage("RHEL-5")
	}
	redistest.Eventually(t, 20*time.Second, func() bool { return r.Get("RHEL-5") == 2 && e.pending(e.triage()) == 0 },
		"the next run, with nothing left pending")
	time.Sleep(500 * time.Millisecond) // a window for a wrong third run to show
	if n := r.Get("RHEL-5"); n != 2 {
		t.Fatalf("%d runs, want exactly 2", n)
	}
	delivered, dead := e.results(event.LockDelivered), e.dead()
	if len(delivered) != depth || len(dead) != burst-depth {
		t.Fatalf("%d delivered, %d dead: want %d and %d", len(delivered), len(dead), depth, burst-depth)
	}
	for _, d := range dead {
		if reason := fmt.Sprint(d.Values[event.DeadFieldError]); !strings.Contains(reason, "mailbox is full") {
			t.Errorf("dead letter's reason %q", reason)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen[0]) != depth || len(seen[1]) != depth-depth/2 || seen[1][0] != seen[0][depth/2] {
		t.Fatalf("the runs found %d and %d follow-ups (%v / %v): want %d, then the %d not accounted for",
			len(seen[0]), len(seen[1]), seen[0], seen[1], depth, depth-depth/2)
	}
}
