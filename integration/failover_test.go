package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// sentinel is a Redis Sentinel process (redis-server --sentinel) monitoring one primary
// under the name "mymaster", quorum 1.
type sentinel struct {
	addr string
	c    *redis.SentinelClient
}

const masterName = "mymaster"

// startSentinel starts a Sentinel for the primary on primaryPort, in a temp dir on a free
// port, and waits until it knows the primary's replicas (a failover needs one).
func startSentinel(t *testing.T, primaryPort, replicas int) *sentinel {
	t.Helper()
	dir := t.TempDir()
	port := redistest.FreePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	// A Sentinel rewrites its configuration file: it must be its own and writable.
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nprotected-mode no\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 10000\nsentinel parallel-syncs %s 1\n",
		port, dir, masterName, primaryPort, masterName, masterName, masterName)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	logf, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server --sentinel: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	s := &sentinel{addr: "127.0.0.1:" + strconv.Itoa(port)}
	s.c = redis.NewSentinelClient(&redis.Options{Addr: s.addr, DisableIdentity: true})
	t.Cleanup(func() { _ = s.c.Close() })
	// A Sentinel looks at each instance (INFO) every 10 s, and turns an old primary that
	// still says it is one into a replica of the new one only when it looks and 4
	// publish periods (2 s each) have passed: 500 ms and 4 × 250 ms here.
	dbg := redis.NewClient(&redis.Options{Addr: s.addr, DisableIdentity: true})
	defer dbg.Close()
	redistest.Eventually(t, 10*time.Second, func() bool {
		return dbg.Do(context.Background(), "sentinel", "debug", "info-period", 500, "publish-period", 250).Err() == nil
	}, "the Sentinel to answer")
	redistest.Eventually(t, 15*time.Second, func() bool {
		rs, err := s.c.Replicas(context.Background(), masterName).Result()
		if err != nil || len(rs) < replicas {
			return false
		}
		for _, r := range rs {
			if r["flags"] != "slave" || r["master-link-status"] != "ok" {
				return false
			}
		}
		return true
	}, "the Sentinel to find the replicas")
	return s
}

// primaryPort is the port Sentinel names for the primary now.
func (s *sentinel) primaryPort() string {
	a, err := s.c.GetMasterAddrByName(context.Background(), masterName).Result()
	if err != nil || len(a) != 2 {
		return ""
	}
	return a[1]
}

// withReplicas gives the scenario's server n replicas (returned), online and caught up.
func withReplicas(t *testing.T, s *scenario, n int) []*redistest.Server {
	t.Helper()
	ctx := context.Background()
	// No 5 s wait for more replicas before the full sync.
	if err := s.rdb.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatal(err)
	}
	var out []*redistest.Server
	for range n {
		out = append(out, redistest.StartServer(t, redistest.ServerOptions{AOF: true,
			Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(s.srv.Port())}}))
	}
	redistest.Eventually(t, 15*time.Second, func() bool {
		pipe := s.rdb.Pipeline()
		pipe.Set(ctx, "failover-test:ready", "1", time.Minute)
		acks := pipe.Do(ctx, "wait", n, 200)
		_, err := pipe.Exec(ctx)
		return err == nil && acks.Val() == int64(n)
	}, "the replicas to come online")
	return out
}

// heldLeases counts the lease keys on the server behind rdb.
func heldLeases(rdb redis.UniversalClient) int {
	keys, _ := rdb.Keys(context.Background(), "lock:*").Result()
	return len(keys)
}

// TestFailoverKeepsExclusion (issue 25, item 5): a primary with a replica, watched by a
// Sentinel; every process reaches Redis through the Sentinel (REDIS_URL
// redis+sentinel://.../mymaster) and the workers wait for one replica on every acquire
// and extend (LOCK_WAIT_REPLICAS=1). While leases are held, SENTINEL FAILOVER promotes
// the replica. The old primary takes writes for a moment after the promotion (until the
// Sentinel turns it into a replica and the clients switch), and they are lost: acquires
// there are refused (their WAIT finds no replica), extends there do not count, so a
// lease the new primary does not have is given up by its holder before its key could
// expire there. LOCK_WAIT_REPLICAS is the number of replicas, as docs/architecture.md
// says it must be for this guarantee: with two replicas and 1, the old primary's other
// replica would go on confirming leases there after the promotion, and lose them when
// it follows the new primary. Until the old primary rejoins as the new one's replica,
// no lease can be confirmed (events wait, redelivered, nothing lost, as
// TestWaitReplicasUnsatisfied shows). The ledger must show no two runs of one issue and agent at once and
// fences that increase, and every event one terminal outcome: a failover, like a
// SIGKILL, can lose an ack sent after an outcome that did replicate, so an event may
// be run again later (at least once), never at the same time.
func TestFailoverKeepsExclusion(t *testing.T) {
	o := defaultOptions()
	o.fetcher = false
	o.noFail = true
	o.runnerMin, o.runnerMax = 200, 600 // runs span the failover
	o.workerArgs = func(group) []string { return []string{"--lock-wait-replicas", "1"} }
	s := newScenario(t, o)
	withReplicas(t, s, 1)
	sn := startSentinel(t, s.srv.Port(), 1)
	oldPrimary := strconv.Itoa(s.srv.Port())
	s.url = "redis+sentinel://" + sn.addr + "/" + masterName + "/0"
	s.rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: masterName, SentinelAddrs: []string{sn.addr},
		DisableIdentity: true})
	t.Cleanup(func() { _ = s.rdb.Close() })

	s.startAll()
	n := issuesFor(12)
	start := time.Now()
	s.addIssues(n)
	redistest.Eventually(t, 20*time.Second, func() bool { return heldLeases(s.rdb) >= 2 }, "two leases held")
	held := heldLeases(s.rdb)
	var failedOver time.Time
	redistest.Eventually(t, 15*time.Second, func() bool {
		// NOGOODSLAVE while the Sentinel's view of the replica is not fresh yet.
		if err := sn.c.Failover(context.Background(), masterName).Err(); err != nil {
			return false
		}
		failedOver = time.Now()
		return true
	}, "SENTINEL FAILOVER to be accepted")
	redistest.Eventually(t, 20*time.Second, func() bool { p := sn.primaryPort(); return p != "" && p != oldPrimary },
		"the Sentinel to name the new primary")
	switched := time.Now()
	s.mu.Lock()
	s.kills[0] = failedOver // no worker has pid 0: the time alone counts (checkOptions.crashDuplicates)
	s.mu.Unlock()
	// More work after the failover, through the new primary.
	s.addIssues(n / 2)
	end := s.waitSettled(90 * time.Second)
	rep := s.checkInvariants(checkOptions{crashDuplicates: true})

	refused := 0
	s.mu.Lock()
	ws := slices.Clone(s.all)
	s.mu.Unlock()
	for _, w := range ws {
		refused += len(logLines(w, "not acknowledged by enough replicas"))
	}
	t.Logf("FIGURE failover: %d leases held at SENTINEL FAILOVER (%s after the first request), new primary named %s later; "+
		"%d acquires/extends refused for want of a replica acknowledgement; settled %s after the failover; %s",
		held, failedOver.Sub(start).Round(time.Millisecond), switched.Sub(failedOver).Round(time.Millisecond), refused,
		end.Sub(failedOver).Round(time.Millisecond), rep)
	if rep.runs == 0 {
		t.Fatal("no runs in the ledger")
	}
}

// refusedKey finds the lease key in the log line of a refused acquire.
var refusedKey = regexp.MustCompile(`replicas: (lock:\S+): WAIT acknowledged`)

// TestWaitReplicasUnsatisfied: with LOCK_WAIT_REPLICAS=1 and the only replica paused
// (SIGSTOP: the primary still counts it as connected, but it acknowledges nothing), no
// lease is granted: every acquire's WAIT times out, the lease is given back (no lock key
// is left on the primary) and the event goes back for redelivery, neither run nor acked
// nor dead-lettered. Once the replica is back, every event is run once.
func TestWaitReplicasUnsatisfied(t *testing.T) {
	o := defaultOptions()
	o.fetcher = false
	o.noFail = true
	o.workerArgs = func(group) []string { return []string{"--lock-wait-replicas", "1"} }
	s := newScenario(t, o)
	replica := withReplicas(t, s, 1)[0]
	s.startAll()

	replica.Pause()
	paused := time.Now()
	n := 6
	s.addIssues(n)
	// refusals counts the refused acquires by lease key. A subscription handles one event
	// at a time, so it tries its first event again and again until the replica is back.
	refusals := func() (all int, most int) {
		s.mu.Lock()
		ws := slices.Clone(s.all)
		s.mu.Unlock()
		byKey := map[string]int{}
		for _, w := range ws {
			for _, l := range logLines(w, "not acknowledged by enough replicas") {
				all++
				if m := refusedKey.FindStringSubmatch(l); m != nil {
					byKey[m[1]]++
				}
			}
		}
		for _, c := range byKey {
			most = max(most, c)
		}
		return all, most
	}
	redistest.Eventually(t, 20*time.Second, func() bool { _, most := refusals(); return most >= 2 },
		"an event's acquire refused, then refused again when it came back")
	runs, _ := s.runs()
	st, err := s.snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	leases := heldLeases(s.rdb)
	replica.Resume()
	resumed := time.Now()
	if len(runs) != 0 || len(st.results) != 0 || len(st.dead) != 0 || leases != 0 {
		t.Fatalf("with the replica paused: %d runs, %d results, %d dead letters, %d lease keys left; want none of each",
			len(runs), len(st.results), len(st.dead), leases)
	}
	end := s.waitSettled(60 * time.Second)
	rep := s.checkInvariants(checkOptions{})
	if rep.done+rep.failed+rep.dead+rep.dropped != rep.events || rep.dropped != 0 {
		t.Errorf("after the replica came back: %s; want every event done", rep)
	}
	refused, _ := refusals()
	t.Logf("FIGURE wait unsatisfied: %d acquires refused in %s with the replica paused (no run, no lease left); "+
		"settled %s after it resumed; %s", refused, resumed.Sub(paused).Round(time.Millisecond),
		end.Sub(resumed).Round(time.Millisecond), rep)
	if strings.Contains(fmt.Sprint(rep.violations), "dead") {
		t.Error("an event was dead-lettered while its lease could not be confirmed")
	}
}
