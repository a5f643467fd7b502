package pipeline_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
)

// A force release stops the holder's handler within a second (not at its next
// heartbeat, TTL/3 = ten seconds here), and no attempt starts under the evicted lease
// after it: the in-lease retry checks the lease before each new attempt. The entry is
// then run again under a new lease.
func TestForceReleaseStopsTheHolderAtOnce(t *testing.T) {
	// Not parallel: it bounds how soon the holder stops (a latency).
	for _, how := range []string{"long attempt", "failed attempt"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			op := e.TriageLocker(30 * time.Second)
			var mu sync.Mutex
			attempts := map[string]int{} // by fence
			var released time.Time
			stopped := make(chan time.Duration, 1)
			o := routerOpts{TTL: 30 * time.Second, MaxIdle: 20 * time.Second, MaxRetries: 3}
			e.start(ctx, o, func(msg *message.Message) error {
				le, _ := lockmw.LeaseFrom(msg.Context())
				fence := strconv.FormatInt(le.Fence(), 10)
				mu.Lock()
				attempts[fence]++
				first := len(attempts) == 1 && attempts[fence] == 1
				mu.Unlock()
				if !first {
					return nil
				}
				if _, err := op.ForceRelease(context.Background(), "triage", issueOf(msg)); err != nil {
					t.Error(err)
				}
				released = time.Now()
				if how == "failed attempt" {
					return errBoom // the retry must not start another attempt under this lease
				}
				<-msg.Context().Done() // an agent's run: cancelled by the eviction
				stopped <- time.Since(released)
				return msg.Context().Err()
			})
			e.publishTriage("RHEL-1")
			if how == "long attempt" {
				select {
				case d := <-stopped:
					if d > time.Second {
						t.Fatalf("the evicted holder's run stopped %s after the force release, want within 1s", d)
					}
					t.Logf("run stopped %s after the force release", d.Round(time.Millisecond))
				case <-time.After(5 * time.Second):
					t.Fatal("the evicted holder's run was not stopped within 5s (its heartbeat is 10s away)")
				}
			}
			// Run again under a new lease, and nothing else under the old one.
			redistest.Eventually(t, 10*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(attempts) == 2 && e.pending(e.triage()) == 0
			}, "the entry ran again under a new lease")
			mu.Lock()
			defer mu.Unlock()
			for f, n := range attempts {
				if n != 1 {
					t.Errorf("%d attempts under fence %s, want 1 (all: %v)", n, f, attempts)
				}
			}
			if len(e.results(event.LockDropped)) != 0 {
				t.Errorf("an event was dropped")
			}
		})
	}
}
