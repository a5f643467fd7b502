package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// envHelper makes the test binary a helper process (see TestHelperProcess).
const envHelper = "YMIR_IT_HELPER"

// TestHelperProcess is a lease holder for TestLatePublishAfterPauseIsRefused: it takes the
// lease triage:RHEL-1 and publishes under it every 20 ms, printing what happens, until a
// publish is refused.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) != "lease" {
		t.Skip("helper process")
	}
	ttl, _ := time.ParseDuration(os.Getenv("HELPER_TTL"))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("HELPER_REDIS"), DisableIdentity: true})
	defer rdb.Close()
	locker, err := lease.New(rdb, lease.Options{TTL: ttl, Owner: "paused"})
	if err != nil {
		t.Fatal(err)
	}
	le, err := locker.Acquire(context.Background(), "triage", "RHEL-1", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("ACQUIRED %d\n", le.Fence())
	for i := 0; ; i++ {
		// Deliberately no look at le.Context(): this is the late writer that only the
		// fence can stop.
		id, err := le.XAdd(context.Background(), "ymir:rebase:c9s", 0,
			map[string]any{"fence": le.Fence(), "seq": i, "writer": "paused"})
		if err != nil {
			fmt.Printf("REFUSED %d %v\n", time.Now().UnixNano(), err)
			return
		}
		fmt.Printf("OK %s\n", id)
		time.Sleep(20 * time.Millisecond) // pacing: one publish per 20ms until refused
	}
}

// TestLatePublishAfterPauseIsRefused: a lease holder is SIGSTOPped past its TTL; meanwhile
// another holder takes the lease (higher fence) and publishes. After SIGCONT the paused
// holder's publishes are refused, and no entry of the old fence lands after the new
// holder's first one.
func TestLatePublishAfterPauseIsRefused(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rdb := srv.Client()
	ttl := time.Second
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelper+"=lease", "HELPER_REDIS="+srv.Addr(), "HELPER_TTL="+ttl.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("helper stderr:\n%s", stderr.String())
		}
	})
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(within time.Duration) string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("helper ended early; stderr:\n%s", stderr.String())
			}
			return l
		case <-time.After(within):
			t.Fatalf("no line from the helper within %s", within)
		}
		return ""
	}
	var oldFence int64
	for {
		l := next(20 * time.Second)
		if f, ok := strings.CutPrefix(l, "ACQUIRED "); ok {
			oldFence, _ = strconv.ParseInt(f, 10, 64)
		}
		if strings.HasPrefix(l, "OK ") && oldFence > 0 {
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	locker, err := lease.New(rdb, lease.Options{TTL: 10 * time.Second, Owner: "successor"})
	if err != nil {
		t.Fatal(err)
	}
	var le *lease.Lease
	redistest.Eventually(t, 3*ttl, func() bool {
		le, err = locker.Acquire(context.Background(), "triage", "RHEL-1", lease.AcquireOptions{})
		return err == nil
	}, "the successor takes the paused holder's lease (last error: %v)", err)
	defer le.Release(context.Background())
	took := time.Since(stopped)
	if le.Fence() <= oldFence {
		t.Fatalf("successor fence %d not above the paused holder's %d", le.Fence(), oldFence)
	}
	firstNew, err := le.XAdd(context.Background(), "ymir:rebase:c9s", 0, map[string]any{"fence": le.Fence(), "writer": "successor"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // pacing: the paused holder wakes well after the successor's publish
	_ = cmd.Process.Signal(syscall.SIGCONT)
	resumed := time.Now()
	var refusal string
	for refusal == "" {
		l := next(10 * time.Second)
		if r, ok := strings.CutPrefix(l, "REFUSED "); ok {
			refusal = r
		}
	}
	if !strings.Contains(refusal, lease.ErrLeaseLost.Error()) {
		t.Errorf("the late publish was refused, but not as a lost lease: %s", refusal)
	}
	// The fence property: nothing of the old fence after the successor's first entry.
	msgs, err := rdb.XRange(context.Background(), "ymir:rebase:c9s", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	old, late := 0, 0
	for _, m := range msgs {
		if m.Values["writer"] == "paused" {
			old++
			if streamid.Compare(m.ID, firstNew) > 0 {
				late++
			}
		}
	}
	if late > 0 {
		t.Errorf("%d entries of the paused holder (fence %d) landed after the successor's first (%s)", late, oldFence, firstNew)
	}
	how := "client side: its heartbeat had already ended the lease"
	if strings.Contains(refusal, "refused (fence") {
		how = "server side: the fenced XADD script found another token"
	}
	t.Logf("FIGURE fence: holder paused %s past a %s TTL; successor took the lease after %s with fence %d > %d; "+
		"the first publish after SIGCONT (%s later) was refused (%s); %d entries of the old fence, all before the successor's",
		time.Since(stopped).Round(time.Millisecond), ttl, took.Round(time.Millisecond), le.Fence(), oldFence,
		time.Since(resumed).Round(time.Millisecond), how, old)
}
