package lease_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The contention test: 3 processes × 8 goroutines race for the same 20 keys. Every win is
// written to a ledger as (key, fence, sent, start, end): sent before the acquire was sent,
// start after Acquire returned, end before Release was sent. Fences are handed out in the
// order Redis granted the lock, so in fence order each hold must start after the previous
// one ended (mutual exclusion), and no fence repeats.
//
// The one exception is physics, not the lease: a holder whose process was descheduled
// past its lease's proof (sent + TTL - SafetyMargin, the longest the lease promises to
// be exclusive without an extend) may still be inside its hold while Redis has expired
// its key and granted the next fence. The lease cannot stop a paused process; fencing is
// what refuses its writes. Such a hold is counted and reported, never taken as an
// overlap, and only a hold that ended within its proof is held to exclusion.

// contenderTTL is the contenders' lease TTL.
const contenderTTL = 2 * time.Second

const (
	envContender = "LEASE_CONTENDER_LEDGER"
	envNS        = "LEASE_CONTENDER_NS"
	envFor       = "LEASE_CONTENDER_FOR"
)

func TestContentionAcrossProcesses(t *testing.T) {
	// Not parallel: runs three contender processes for seconds and times their holds against a 2 s TTL.
	if os.Getenv(envContender) != "" {
		t.Skip("contender process")
	}
	_, ns := redistest.Client(t) // namespace cleanup and a reachability check
	runFor := 10 * time.Second
	if testing.Short() {
		runFor = 3 * time.Second
	}
	dir := t.TempDir()
	var procs []*exec.Cmd
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestContender$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			envContender+"="+filepath.Join(dir, fmt.Sprintf("ledger-%d", i)),
			envNS+"="+ns, envFor+"="+runFor.String())
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("contender %d output:\n%s", i, out.String())
			}
		})
	}
	for i, p := range procs {
		if err := p.Wait(); err != nil {
			t.Fatalf("contender %d: %v", i, err)
		}
	}

	type entry struct {
		key              string
		fence            int64
		sent, start, end int64
		proc             int
	}
	byKey := map[string][]entry{}
	total := 0
	for i := range procs {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("ledger-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var e entry
			if _, err := fmt.Sscanf(sc.Text(), "%s %d %d %d %d", &e.key, &e.fence, &e.sent, &e.start, &e.end); err != nil {
				t.Fatalf("ledger line %q: %v", sc.Text(), err)
			}
			e.proc = i
			byKey[e.key] = append(byKey[e.key], e)
			total++
		}
		f.Close()
	}
	if total < 200 || len(byKey) != 20 {
		t.Fatalf("only %d holds over %d keys: the race did not happen", total, len(byKey))
	}
	proof := (contenderTTL - lease.DefaultSafetyMargin(contenderTTL)).Nanoseconds()
	procsSeen := map[int]bool{}
	stalled := 0
	for key, es := range byKey {
		sort.Slice(es, func(i, j int) bool { return es[i].fence < es[j].fence })
		for i := 1; i < len(es); i++ {
			prev, cur := es[i-1], es[i]
			if cur.fence == prev.fence {
				t.Fatalf("%s: fence %d handed out twice (procs %d and %d)", key, cur.fence, prev.proc, cur.proc)
			}
			if cur.start >= prev.end {
				continue
			}
			if prev.end > prev.sent+proof {
				stalled++ // its process outlived its lease's proof: see the comment above
				continue
			}
			t.Fatalf("%s: holders overlap: fence %d (proc %d) [%d,%d] and fence %d (proc %d) [%d,%d]",
				key, prev.fence, prev.proc, prev.start, prev.end, cur.fence, cur.proc, cur.start, cur.end)
		}
		for _, e := range es {
			procsSeen[e.proc] = true
		}
	}
	if len(procsSeen) != 3 {
		t.Fatalf("only %d processes ever won a lease", len(procsSeen))
	}
	if stalled > total/100 {
		t.Fatalf("%d of %d holds outlived their lease's proof: the contenders were starved, the test proves little", stalled, total)
	}
	t.Logf("%d holds over 20 keys by 3 processes × 8 goroutines in %s; no overlap, fences increasing (%d holds outlived their proof in a stalled process)",
		total, runFor, stalled)
}

// TestContender is one contending process; it runs only when started by the test above.
func TestContender(t *testing.T) {
	// Not parallel: the body of a contender process, which TestContentionAcrossProcesses runs alone.
	ledger := os.Getenv(envContender)
	if ledger == "" {
		t.Skip("run by TestContentionAcrossProcesses")
	}
	runFor, err := time.ParseDuration(os.Getenv(envFor))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := redis.ParseURL(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.DisableIdentity = true
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	l, err := lease.New(rdb, lease.Options{Scope: os.Getenv(envNS), TTL: contenderTTL})
	if err != nil {
		t.Fatal(err)
	}
	proof := (contenderTTL - lease.DefaultSafetyMargin(contenderTTL)).Nanoseconds()
	var mu sync.Mutex
	var lines []string
	deadline := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				key := "RHEL-" + strconv.Itoa(1+rand.IntN(20))
				sent := time.Now().UnixNano()
				le, err := l.Acquire(context.Background(), "triage", key, lease.AcquireOptions{})
				if errors.Is(err, lease.ErrLocked) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				start := time.Now().UnixNano()
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				end := time.Now().UnixNano()
				// A lease may end only in a process stalled past its proof, and then it must.
				if err := le.Err(); err != nil && end <= sent+proof {
					t.Errorf("lease ended while held within its proof: %v", err)
				}
				if _, err := le.Release(context.Background()); err != nil {
					t.Error(err)
				}
				mu.Lock()
				lines = append(lines, fmt.Sprintf("%s %d %d %d %d", key, le.Fence(), sent, start, end))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := os.WriteFile(ledger, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
