package pipelinetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// A test of your own handler: the kit's router runs it under the real lease, against the
// test Redis, exactly as a worker would. In a test, t is the test's *testing.T; an example
// has none, so exampleT stands in for it.
func Example() {
	t := &exampleT{}
	defer t.end()

	e := pipelinetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The handler under test: it says which issue it works on, and under which fence.
	done := make(chan string, 1)
	e.StartTriage(ctx, pipelinetest.TriageOptions{}, func(msg *message.Message) error {
		lease, ok := lockmw.LeaseFrom(msg.Context())
		done <- fmt.Sprintf("%s under a lease: %v, fence > 0: %v", msg.Metadata.Get(event.MetaIssueKey), ok, ok && lease.Fence() > 0)
		return nil
	})
	e.PublishTriage("RHEL-42")
	fmt.Println(<-done)
	// Once the handler returned, the lease is released and the entry acked.
	for deadline := time.Now().Add(10 * time.Second); e.Pending(e.TriageStream(), "triage") > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("pending:", e.Pending(e.TriageStream(), "triage"), "dead letters:", len(e.Dead()))
	// Output:
	// RHEL-42 under a lease: true, fence > 0: true
	// pending: 0 dead letters: 0
}

// exampleT is the little of testing.TB the kit uses, for the example: Fatal panics, and
// end runs the cleanups (closing the router and clients, deleting the keys) as a test's
// end would.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleT) end() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
