package pipelinetest_test

// No t.Parallel in this package: TestEnvLeavesNoConnectionOrGoroutine counts the
// process's goroutines, which another test running beside it would change.

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// TestMain pings the shared test Redis once: with it down, the package fails at once with
// one line naming the URL and how to start a server.
func TestMain(m *testing.M) { redistest.Main(m) }

// A handler run by the kit's router runs under a real lease: it sees its fence, a second
// event for the issue while the first holds it is dropped and recorded, and the entry is
// acked once the handler returns. Two subscriptions, so that the second event is read while the
// first runs.
func TestEnvRunsAHandlerUnderTheLease(t *testing.T) {
	e := pipelinetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, release := make(chan int64, 1), make(chan struct{})
	var runs pipelinetest.Runs
	e.StartTriage(ctx, pipelinetest.TriageOptions{Concurrency: 2}, func(msg *message.Message) error {
		runs.Add(msg.Metadata.Get(event.MetaIssueKey))
		lease, ok := lockmw.LeaseFrom(msg.Context())
		if !ok {
			return errors.New("no lease in the handler's context")
		}
		held <- lease.Fence()
		<-release
		return nil
	})
	e.PublishTriage("RHEL-1")
	var fence int64
	select {
	case fence = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not run")
	}
	if fence <= 0 {
		t.Fatalf("fence %d, want a positive one", fence)
	}
	e.PublishTriage("RHEL-1")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(e.Records(event.LockDropped)) == 1 },
		"the second event dropped while the first holds the lease")
	close(release)
	redistest.Eventually(t, 10*time.Second, func() bool { return e.Pending(e.TriageStream(), "triage") == 0 }, "both acked")
	if n := runs.Get("RHEL-1"); n != 1 {
		t.Fatalf("runs %d, want 1 (%v)", n, runs.Snapshot())
	}
	if d := e.Dead(); len(d) != 0 {
		t.Fatalf("dead letters %v", d)
	}
}

// An Env leaves no connection and no goroutine behind once its test has ended, whether
// its router was stopped by its context or only by the test's end: its routers are closed
// with their subscriptions' clients, and its shared client is closed.
func TestEnvLeavesNoConnectionOrGoroutine(t *testing.T) {
	probe, _ := redistest.Client(t)
	for _, stop := range []string{"context", "cleanup"} {
		// Counted here, with the probe's connection open and nothing of the subtest started.
		before := runtime.NumGoroutine()
		name := "pipelinetest-leak-" + strings.TrimSuffix(redistest.Namespace(), ":")
		var shared *redis.Client
		t.Run("stopped by "+stop, func(t *testing.T) {
			e := pipelinetest.New(t)
			shared = e.Client
			// Names the subscriptions' connections, so that CLIENT LIST finds them.
			e.Options.ClientName = name
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			handled := make(chan struct{}, 1)
			_, done := e.StartTriage(ctx, pipelinetest.TriageOptions{Concurrency: 2}, func(*message.Message) error {
				handled <- struct{}{}
				return nil
			})
			e.PublishTriage("RHEL-7")
			select {
			case <-handled:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler did not run")
			}
			if n := namedConns(t, probe, name); n == 0 {
				t.Fatalf("no connection named %s while the router runs: the check would prove nothing", name)
			}
			if stop == "context" {
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("router: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the router did not stop when its context ended")
				}
			}
		})
		if err := shared.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
			t.Errorf("stopped by %s: the env's client still answers (%v) after its test", stop, err)
		}
		if n := shared.PoolStats().TotalConns; n != 0 {
			t.Errorf("stopped by %s: the env's client keeps %d connections after its test", stop, n)
		}
		redistest.Eventually(t, 10*time.Second, func() bool { return namedConns(t, probe, name) == 0 },
			"stopped by %s: no connection named %s left on the server", stop, name)
		waitGoroutines(t, before, stop)
	}
}

// namedConns counts the server's connections named name (CLIENT LIST, as the server sees
// them: a connection a client forgot stays listed).
func namedConns(t *testing.T, probe *redis.Client, name string) int {
	t.Helper()
	list, err := probe.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+name+" ") {
			n++
		}
	}
	return n
}

// waitGoroutines polls until the process runs no more goroutines than before, and fails
// with their stacks when that does not happen within the deadline.
func waitGoroutines(t *testing.T, before int, stop string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("stopped by %s: %d goroutines, %d before the env:\n%s", stop, runtime.NumGoroutine(), before, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
