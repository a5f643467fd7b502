package pipeline_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Worker processes for the crash and shutdown tests: the test binary re-executed with
// YMIR_TEST_WORKER set runs one triage router until SIGTERM.
const envWorker = "YMIR_TEST_WORKER"

type workerSpec struct {
	ns, consumer  string
	ttl, maxIdle  time.Duration
	block, hold   time.Duration // hold 0: until cancelled
	claimInterval time.Duration
}

func startWorker(t *testing.T, w workerSpec) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envWorker+"=1",
		"W_NS="+w.ns, "W_CONSUMER="+w.consumer, "W_TTL="+w.ttl.String(), "W_MAXIDLE="+w.maxIdle.String(),
		"W_BLOCK="+w.block.String(), "W_HOLD="+w.hold.String(), "W_CLAIM="+w.claimInterval.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "WORKER READY") {
				close(ready)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("worker %s stderr:\n%s", w.consumer, stderr.String())
		}
	})
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatalf("worker %s did not start", w.consumer)
	}
	return cmd, ready
}

// TestWorkerProcess is the worker process; it runs only under startWorker.
func TestWorkerProcess(t *testing.T) {
	// Not parallel: the helper process of the SIGKILL and SIGTERM tests, not a test of its own.
	if os.Getenv(envWorker) == "" {
		t.Skip("worker process for the crash tests")
	}
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(os.Getenv(k)); return d }
	ns := os.Getenv("W_NS")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	opts, err := pipeline.ClientOptions(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewUniversalClient(opts)
	defer rdb.Close()
	locker, err := lease.New(rdb, lease.Options{Scope: ns, TTL: dur("W_TTL")})
	if err != nil {
		t.Fatal(err)
	}
	consumer, hold := os.Getenv("W_CONSUMER"), dur("W_HOLD")
	ledger := ns + "ledger"
	r, err := pipeline.NewRouter(pipeline.RouterConfig{Client: rdb, ClientOptions: opts, Topology: event.Topology{Namespace: ns + "ymir"},
		Agent: "triage", Consumer: consumer, BlockTime: dur("W_BLOCK"), MaxIdleTime: dur("W_MAXIDLE"),
		ClaimInterval: dur("W_CLAIM"), NackResendSleep: 50 * time.Millisecond, Locker: locker,
		TracerProvider: workerTracing(),
		Handler: func(msg *message.Message) error {
			// The sixth field: the delivery span's traceparent ("-" untraced); the seventh,
			// the stream entry.
			rdb.RPush(context.Background(), ledger, fmt.Sprintf("start %s %s %d %s %s %s", issueOf(msg), consumer, os.Getpid(), msg.Metadata.Get("fence"),
				deliveryTraceParent(msg), event.EntryID(msg)))
			if hold == 0 {
				<-msg.Context().Done()
				return msg.Context().Err()
			}
			select {
			case <-time.After(hold):
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
			rdb.RPush(context.Background(), ledger, fmt.Sprintf("end %s %s %d", issueOf(msg), consumer, os.Getpid()))
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-r.Running(); fmt.Println("WORKER READY") }()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

func ledgerLines(e *env, prefix string) []string {
	all := e.rdb.LRange(context.Background(), e.ns+"ledger", 0, -1).Val()
	var out []string
	for _, l := range all {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// A worker killed with SIGKILL mid-handler: its event is re-run by another consumer once
// the lease expires (within TTL + claim interval), under a higher fence, and XPENDING
// ends empty.
func TestSIGKILLMidHandlerIsRerunElsewhere(t *testing.T) {
	// Not parallel: it runs worker processes and times their recovery after SIGKILL.
	e := newEnv(t)
	ttl, maxIdle, claim := time.Second, 500*time.Millisecond, 100*time.Millisecond
	a, _ := startWorker(t, workerSpec{ns: e.ns, consumer: "a", ttl: ttl, maxIdle: maxIdle, block: 200 * time.Millisecond, hold: 30 * time.Second, claimInterval: claim})
	e.publishTriage("RHEL-50")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(ledgerLines(e, "start")) == 1 }, "a starts")
	_ = a.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	var fenceB string
	var rerunAt time.Time
	e.start(ctx, routerOpts{Consumer: "b", TTL: ttl, MaxIdle: maxIdle}, func(msg *message.Message) error {
		if r.Add(issueOf(msg)) == 1 {
			rerunAt, fenceB = time.Now(), msg.Metadata.Get("fence")
		}
		return nil
	})
	redistest.Eventually(t, 15*time.Second, func() bool { return r.Get("RHEL-50") == 1 && e.pending(e.triage()) == 0 }, "b re-runs it")
	fenceA := strings.Fields(ledgerLines(e, "start")[0])[4]
	fa, _ := strconv.Atoi(fenceA)
	fb, _ := strconv.Atoi(fenceB)
	if fb <= fa {
		t.Fatalf("re-run fence %s not above the killed holder's %s", fenceB, fenceA)
	}
	recovery := rerunAt.Sub(killed)
	bound := ttl + claim + 500*time.Millisecond
	t.Logf("recovery after SIGKILL: %s (bound: lease TTL %s + claim interval %s + 500ms slack)", recovery, ttl, claim)
	if recovery > bound {
		t.Fatalf("re-run %s after the kill, bound %s", recovery, bound)
	}
	if r.Get("RHEL-50") != 1 {
		t.Fatalf("re-run %d times", r.Get("RHEL-50"))
	}
}

// SIGTERM: the worker stops reading, cancels the handler, releases the lease, leaves the
// entry pending and exits within BLOCK_TIME + 1 s; restarted under the same consumer
// name it resumes the entry at once, long before MAX_IDLE_TIME.
func TestSIGTERMExitsInTimeAndRestartResumesAtOnce(t *testing.T) {
	// Not parallel: it times a worker process's exit after SIGTERM and its resumption.
	e := newEnv(t)
	block := time.Second
	spec := workerSpec{ns: e.ns, consumer: "a", ttl: 3 * time.Second, maxIdle: 30 * time.Second, block: block, claimInterval: time.Second}
	a, _ := startWorker(t, spec)
	e.publishTriage("RHEL-51")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(ledgerLines(e, "start")) == 1 }, "a starts")
	_ = a.Process.Signal(syscall.SIGTERM)
	termed := time.Now()
	err := a.Wait()
	took := time.Since(termed)
	t.Logf("shutdown on SIGTERM: %s (bound BLOCK_TIME %s + 1s)", took, block)
	if err != nil {
		t.Fatalf("worker exit: %v", err)
	}
	if took > block+time.Second {
		t.Fatalf("shutdown took %s, bound %s", took, block+time.Second)
	}
	if n := e.rdb.Exists(context.Background(), "lock:"+e.ns+"triage:RHEL-51").Val(); n != 0 {
		t.Fatal("lease not released on shutdown")
	}
	if e.pending(e.triage()) != 1 {
		t.Fatalf("entry not left pending: %d", e.pending(e.triage()))
	}
	spec.hold = 10 * time.Millisecond
	restarted := time.Now()
	startWorker(t, spec)
	redistest.Eventually(t, 5*time.Second, func() bool { return len(ledgerLines(e, "end")) == 1 && e.pending(e.triage()) == 0 }, "resumed")
	t.Logf("restart to resumed and done: %s (MAX_IDLE_TIME %s)", time.Since(restarted), spec.maxIdle)
}
