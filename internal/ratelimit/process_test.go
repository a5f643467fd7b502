package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// The done-when test of issue 37's shared rate limits: three OS processes (this test
// binary, re-executed) call the fake Jira as fast as their budget lets them, four
// goroutines each. The fake Jira answers 429 with Retry-After above 5 requests/s
// (a bucket of 5), and its bucket is empty when the first request comes, as if someone
// else had just spent it. The processes share JIRA_RATE 4/s with a burst of 4 through
// Redis. Their combined rate stays within the limit plus the burst, the first 429
// pauses all three, and no 429 comes after that first window.

// childEnv and the other variables tell a re-executed test binary to be a child.
const (
	childEnv   = "RATELIMIT_TEST_CHILD"
	childJira  = "RATELIMIT_TEST_JIRA"
	childNS    = "RATELIMIT_TEST_NS"
	childStart = "RATELIMIT_TEST_START_MS"
	childEnd   = "RATELIMIT_TEST_END_MS"
	// childRedis, when set, is a Redis Cluster's nodes, comma-separated; else the
	// shared test Redis.
	childRedis = "RATELIMIT_TEST_REDIS"
)

// The shared budget of the children, and the fake Jira's own limit above it.
var (
	childRate = ratelimit.Rate{N: 4, Per: time.Second, Burst: 4}
	jiraLimit = fakejira.RateLimit{N: 5, Per: time.Second, Burst: 5, StartEmpty: true}
)

const childWorkers = 4

// runChild is a child process: it calls Jira from childWorkers goroutines from the
// start time to the end time, under the shared budget, and exits 0.
func runChild() int {
	start, _ := strconv.ParseInt(os.Getenv(childStart), 10, 64)
	end, _ := strconv.ParseInt(os.Getenv(childEnd), 10, 64)
	var rdb redis.UniversalClient
	if nodes := os.Getenv(childRedis); nodes != "" {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(nodes, ","), DisableIdentity: true})
	} else {
		opts, err := redis.ParseURL(redistest.URL())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		rdb = redis.NewClient(opts)
	}
	defer func() { _ = rdb.Close() }()
	l, err := ratelimit.New(ratelimit.Config{Client: rdb, Prefix: os.Getenv(childNS) + "ratelimit:",
		Limits: map[string]ratelimit.Rate{"jira": childRate}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	budget, _ := l.Budget("jira")
	jc, err := jira.New(jira.Options{BaseURL: os.Getenv(childJira), Token: "t", API: jira.APIServer, RateLimit: -1,
		MaxRetries: 100, RetryBaseDelay: 50 * time.Millisecond, MaxRetryDelay: time.Second, Shared: budget})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	time.Sleep(time.Until(time.UnixMilli(start)))
	ctx, cancel := context.WithDeadline(context.Background(), time.UnixMilli(end))
	defer cancel()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for range childWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := jc.GetIssue(ctx, "RHEL-1", nil)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
					return // a wait that would outlast the end
				default:
					failed.Add(1)
					fmt.Fprintln(os.Stderr, err)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("ok %d failed %d\n", ok.Load(), failed.Load())
	if failed.Load() > 0 {
		return 1
	}
	return 0
}

// child is one re-executed test binary.
type child struct {
	cmd       *exec.Cmd
	out, errb lockedBuffer
}

func startChildren(t *testing.T, n int, jiraURL, ns string, start, end time.Time, extraEnv ...string) []*child {
	t.Helper()
	var out []*child
	for range n {
		c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		c.cmd.Env = append(append(os.Environ(), extraEnv...), childEnv+"=1", childJira+"="+jiraURL, childNS+"="+ns,
			childStart+"="+strconv.FormatInt(start.UnixMilli(), 10), childEnd+"="+strconv.FormatInt(end.UnixMilli(), 10))
		c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.errb
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
		out = append(out, c)
	}
	return out
}

// checkRequests holds the fake Jira's log to the promises: within the limit plus the
// burst over every window of a second and over the whole run, some 429s first (its
// bucket started empty), and none after the first Retry-After window.
func checkRequests(t *testing.T, reqs []fakejira.Request, run time.Duration) (ok int) {
	t.Helper()
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].At.Before(reqs[j].At) })
	if len(reqs) == 0 {
		t.Fatal("no requests reached the fake Jira")
	}
	per := childRate.N + childRate.Burst
	for i, r := range reqs {
		n := 0
		for _, s := range reqs[i:] {
			if s.At.Sub(r.At) >= time.Second {
				break
			}
			n++
		}
		if n > per {
			t.Errorf("%d requests in the second from %s; the limit plus the burst is %d", n, r.At.Format("15:04:05.000"), per)
			break
		}
	}
	if most := childRate.Burst + int(run/childRate.Interval()) + 1; len(reqs) > most {
		t.Errorf("%d requests in %s; the limit plus the burst allow %d", len(reqs), run, most)
	}
	var first429 time.Time
	for _, r := range reqs {
		switch {
		case r.Status == http.StatusTooManyRequests && first429.IsZero():
			first429 = r.At
		case r.Status == http.StatusTooManyRequests && r.At.Sub(first429) >= time.Second:
			t.Errorf("a 429 at %s, %s after the first: the pause did not hold everyone", r.At.Format("15:04:05.000"), r.At.Sub(first429))
		case r.Status == http.StatusOK:
			ok++
		}
	}
	if first429.IsZero() {
		t.Error("no 429 at all: the fake Jira's empty bucket was never met")
	}
	t.Logf("FIGURE %d requests from 3 processes in %s (%d ok), limit %s", len(reqs), run, ok, childRate)
	return ok
}

func jiraWithLimit(t *testing.T) *fakejira.Server {
	t.Helper()
	srv := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1"}}, RateLimit: jiraLimit})
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestThreeProcessesShareJiraBudget(t *testing.T) {
	t.Parallel()
	_, ns := redistest.Client(t)
	threeProcesses(t, ns)
}

// The same on a 3-master Redis Cluster: GCRA's key and the pause key live on whichever
// masters their slots say; each command touches one key.
func TestThreeProcessesShareJiraBudgetOnCluster(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3)
	ns := redistest.Namespace()
	// GCRA's key lives while the budget is in use: seen on the cluster, the children
	// used it.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes, DisableIdentity: true})
	defer func() { _ = cc.Close() }()
	ctx, stop := context.WithCancel(context.Background())
	seen := make(chan bool, 1)
	go func() {
		for ctx.Err() == nil {
			if cc.Exists(ctx, "rate:"+ns+"ratelimit:jira").Val() == 1 {
				seen <- true
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		seen <- false
	}()
	threeProcesses(t, ns, childRedis+"="+strings.Join(nodes, ","))
	stop()
	if !<-seen {
		t.Error("no GCRA state on the cluster: the children did not use it")
	}
}

func threeProcesses(t *testing.T, ns string, extraEnv ...string) {
	t.Helper()
	srv := jiraWithLimit(t)
	start := time.Now().Add(2 * time.Second) // every child started and waiting
	const run = 4 * time.Second
	kids := startChildren(t, 3, srv.URL(), ns, start, start.Add(run), extraEnv...)
	for i, c := range kids {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s%s", i, err, c.out.String(), c.errb.String())
		}
	}
	if ok := checkRequests(t, srv.Requests(), run); ok < 3 {
		t.Errorf("only %d requests succeeded", ok)
	}
}

// One of the three is SIGKILLed mid-run (perhaps in a wait, perhaps with a request in
// flight): the others go on within the same budget, and nothing it held stops them.
func TestSharedJiraBudgetSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	_, ns := redistest.Client(t)
	srv := jiraWithLimit(t)
	start := time.Now().Add(2 * time.Second)
	const run = 5 * time.Second
	kids := startChildren(t, 3, srv.URL(), ns, start, start.Add(run))
	time.Sleep(time.Until(start.Add(run / 2)))
	killedAt := time.Now()
	if err := kids[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := kids[0].cmd.Wait(); err == nil {
		t.Fatal("the SIGKILLed child exited 0")
	}
	for i, c := range kids[1:] {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s%s", i+1, err, c.out.String(), c.errb.String())
		}
	}
	reqs := srv.Requests()
	checkRequests(t, reqs, run)
	after := 0
	for _, r := range reqs {
		if r.At.After(killedAt) && r.Status == http.StatusOK {
			after++
		}
	}
	if after == 0 {
		t.Error("no request succeeded after the SIGKILL: the survivors stopped")
	}
}

// lockedBuffer is a goroutine-safe output buffer for a child process.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
