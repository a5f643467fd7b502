package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func fakejiraIssue(key string) fakejira.Issue {
	now := time.Now()
	return fakejira.Issue{Key: key, Summary: "integration issue " + key, Status: "New", Updated: now, Created: now,
		Labels: []string{"ymir_triaged_rebase"}}
}

// redisCluster is a local Redis Cluster of masters only, on loopback ports.
type redisCluster struct {
	ports []int
	stops []func() // each node's: kill it and wait for it
}

// clusterPorts returns n ports p such that p and its cluster bus port p+10000 are free.
func clusterPorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for tries := 0; len(out) < n && tries < 1000; tries++ {
		p := 20000 + int(time.Now().UnixNano()%30000)
		ok := true
		for _, q := range []int{p, p + 10000} {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		for _, o := range out {
			if o == p {
				ok = false
			}
		}
		if ok {
			out = append(out, p)
		}
	}
	if len(out) < n {
		t.Fatal("no free ports for the cluster")
	}
	return out
}

// startCluster starts n masters with `redis-server --cluster-enabled yes` (AOF on) and
// joins them with `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`.
// Everything is stopped when the test ends.
func startCluster(t *testing.T, n int) *redisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatal("redis-cli not found on PATH (it creates the cluster); install redis-tools")
	}
	c := &redisCluster{ports: clusterPorts(t, n)}
	t.Cleanup(func() {
		for _, stop := range c.stops {
			stop()
		}
	})
	var addrs []string
	for i := range c.ports {
		// A port found free may be taken before the server binds it (an outgoing
		// connection's ephemeral port, another test's server): the server then exits, and
		// the node starts again on another port.
		for try := 0; ; try++ {
			stop, err := startNode(t, c.ports[i])
			if err == nil {
				c.stops = append(c.stops, stop)
				break
			}
			if try == 4 {
				t.Fatalf("cluster node: %v", err)
			}
			t.Logf("cluster node on port %d: %v; trying another port", c.ports[i], err)
			c.ports[i] = clusterPorts(t, 1)[0]
		}
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(c.ports[i]))
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		for {
			info, _ := exec.Command("redis-cli", "-h", "127.0.0.1", "-p", strings.TrimPrefix(a, "127.0.0.1:"), "cluster", "info").Output()
			if strings.Contains(string(info), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s within 20s:\n%s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// startNode starts one cluster master on port p and waits until it answers PING. It
// returns the function that stops it, or an error (with its log's tail) when the server
// exits first or does not answer within 10 s; the server is then stopped.
func startNode(t *testing.T, p int) (func(), error) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(p), "--bind", "127.0.0.1", "--dir", dir,
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no")
	logPath := filepath.Join(dir, "redis.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logf.Close() }()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server --cluster-enabled: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tail := func() string {
		b, _ := os.ReadFile(logPath)
		if len(b) > 600 {
			b = b[len(b)-600:]
		}
		return string(b)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(p), DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		select {
		case <-exited:
			return nil, fmt.Errorf("redis-server on port %d exited before it answered:\n%s", p, tail())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return nil, fmt.Errorf("redis-server on port %d did not answer within 10s:\n%s", p, tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() { _ = cmd.Process.Kill(); <-exited }, nil
}

// URL is the REDIS_URL of the cluster: every node, comma-separated.
func (c *redisCluster) URL() string {
	var hs []string
	for _, p := range c.ports {
		hs = append(hs, "127.0.0.1:"+strconv.Itoa(p))
	}
	return "redis://" + strings.Join(hs, ",") + "/0"
}

// Client is a cluster client for the test's own checks.
func (c *redisCluster) Client() *redis.ClusterClient {
	var hs []string
	for _, p := range c.ports {
		hs = append(hs, "127.0.0.1:"+strconv.Itoa(p))
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: hs, DisableIdentity: true})
}

func (c *redisCluster) String() string { return fmt.Sprintf("cluster %v", c.ports) }

// TestClusterPipeline: the worker and router suite on a 3-master Redis Cluster: every
// process gets the three nodes in REDIS_URL (so the lease keys take the hash-tagged
// KeysCluster layout), issues come in through `ymirflow fetch` sweeps and `ymirflow
// webhook` deliveries racing each other (the fake Jira delivers a webhook for every issue
// it creates), flow through every agent, two workers are SIGKILLed mid-run, and the
// invariants are checked as on a single server; each issue's triage request is published
// once.
func TestClusterPipeline(t *testing.T) {
	o := defaultOptions()
	o.cluster = true
	o.webhook = true
	o.noFail = true // dead letters on Cluster: TestClusterDeadLetter
	o.runnerMin, o.runnerMax = 100, 500
	s := newScenario(t, o)
	if !s.feedsWithFetcher() {
		t.Fatal("`ymirflow fetch` is not built")
	}
	s.startWebhook()
	s.startAll()
	n := issuesFor(30)
	start := time.Now()
	s.addIssues(n / 2)
	var kills []time.Duration
	for i := 0; i < 2; i++ {
		time.Sleep(1500 * time.Millisecond) // pacing: each SIGKILL lands mid-run
		w := s.pickVictim()
		at := s.kill(w)
		s.startWorker(w.g, w.name)
		kills = append(kills, at.Sub(start))
	}
	s.addIssues(n - n/2)
	end := s.waitSettled(2 * time.Minute)
	rep := s.checkInvariants(checkOptions{crashDuplicates: true})
	st, err := s.snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	requests := map[string]int{}
	for _, e := range st.entries {
		if e.route.Agent == "triage" {
			requests[e.issue]++
		}
	}
	for issue, c := range requests {
		if c != 1 {
			t.Errorf("%s: %d triage requests, want 1 (the fetcher and the webhook raced)", issue, c)
		}
	}
	hookLog, _ := os.ReadFile(s.hookLog)
	fetchLog, _ := os.ReadFile(s.fetchLg)
	byHook := strings.Count(string(hookLog), `"outcome":"published"`)
	t.Logf("FIGURE cluster: %d issues, %d events settled in %s on a 3-master cluster (fed by `ymirflow fetch` and `ymirflow webhook`: %d published by the webhook, the rest by sweeps), SIGKILLs at %v; %s",
		n, rep.events, end.Sub(start).Round(time.Millisecond), byHook, kills, rep)
	if len(requests) != n || strings.Contains(string(fetchLog), "CROSSSLOT") || strings.Contains(string(hookLog), "CROSSSLOT") {
		t.Errorf("%d of %d issues requested; CROSSSLOT in the fetcher's or webhook's log: %v/%v", len(requests), n,
			strings.Contains(string(fetchLog), "CROSSSLOT"), strings.Contains(string(hookLog), "CROSSSLOT"))
	}
}

// TestClusterDeadLetter: on Redis Cluster, a downstream event whose retries are exhausted
// must reach ymir:dead and leave XPENDING, as on one server. The dead-letter middleware
// writes the dead letter and acks the entry in one MULTI (pipeline/deadletter.go bury),
// and ymir:dead and the input stream hash to different slots: CROSSSLOT, the entry stays
// pending, and it is redelivered and re-run for ever (its runner and its stage.failed
// record again each time).
func TestClusterDeadLetter(t *testing.T) {
	o := defaultOptions()
	o.cluster = true
	o.fetcher = false
	o.runnerMin, o.runnerMax = 10, 20
	s := newScenario(t, o)
	g := group{agent: "rebase", branch: "c9s"}
	w := s.startWorker(g, workerName(g, 0))
	s.fj.AddIssues(fakejiraIssue("RHEL-5")) // RHEL-5: the runner reports failure
	s.enqueueTo(g, "RHEL-5")
	deadline := time.Now().Add(8 * time.Second)
	var st *state
	for time.Now().Before(deadline) {
		var err error
		if st, err = s.snapshot(context.Background()); err == nil && len(st.dead) > 0 && st.pending[topo.Stream("rebase", "c9s", false)+" rebase-c9s"] == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	runs, _ := s.runs()
	failed := 0
	for _, r := range st.results {
		if str(r.Values["event_type"]) == "stage.failed" {
			failed++
		}
	}
	crossslot := logLines(w, "CROSSSLOT", "dead letter")
	t.Logf("cluster dead letter: %d dead letters, %d runner runs, %d stage.failed records for one event; %d 'cannot write the dead letter' CROSSSLOT lines",
		len(st.dead), len(runs), failed, len(crossslot))
	if len(crossslot) > 0 {
		t.Logf("  %s", crossslot[0])
	}
	if len(st.dead) != 1 || failed != 1 || len(runs) != s.o.tm.MaxRetries {
		t.Fatalf("on Redis Cluster the exhausted event was not dead-lettered once: %d dead letters, %d stage.failed records, "+
			"%d runs (want 1, 1, %d)", len(st.dead), failed, len(runs), s.o.tm.MaxRetries)
	}
	s.checkInvariants(checkOptions{})
}

// TestClusterLockSuite: the lease on a 3-master Redis Cluster with lease.KeysCluster, for
// the paths the worker processes do not reach in TestClusterPipeline: every key of a lease
// in one slot; conflict naming the holder; the heartbeat keeping a lease past its TTL; a
// force release bumping the fence and refusing the evicted holder's publish; InspectMany and
// List across nodes; coalesce (queue while held, publish on release); superseded events.
func TestClusterLockSuite(t *testing.T) {
	c := startCluster(t, 3)
	rdb := c.Client()
	defer rdb.Close()
	ctx := context.Background()
	ttl := 600 * time.Millisecond
	newLocker := func(owner string) *lease.Locker {
		l, err := lease.New(rdb, lease.Options{TTL: ttl, Owner: owner, Format: lease.KeysCluster})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := newLocker("a"), newLocker("b")

	// Every key of a lease hashes to one slot.
	k := a.Keys("triage", "RHEL-1")
	slot := rdb.ClusterKeySlot(ctx, k.Lock).Val()
	for _, key := range []string{k.Info, k.Fence, k.Queue, k.Done} {
		if s := rdb.ClusterKeySlot(ctx, key).Val(); s != slot {
			t.Fatalf("%s is in slot %d, %s in %d", key, s, k.Lock, slot)
		}
	}

	la, err := a.Acquire(ctx, "triage", "rhel-1", lease.AcquireOptions{MessageID: "1-0"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{})
	var locked *lease.LockedError
	if !errors.As(err, &locked) || locked.Holder.Owner != "a" || locked.Holder.Fence != la.Fence() {
		t.Fatalf("conflict: %v, want a LockedError naming a (fence %d)", err, la.Fence())
	}
	time.Sleep(3 * ttl) // the point: only the heartbeat keeps the lease past its TTL
	if err := la.Err(); err != nil {
		t.Fatalf("the heartbeat did not keep the lease past %s: %v", 3*ttl, err)
	}
	if _, err := la.XAdd(ctx, "ymir:rebase:c9s", 0, map[string]any{"w": "a"}); err != nil {
		t.Fatalf("fenced publish while held: %v", err)
	}
	// Many leases on every node: InspectMany and List see them all.
	var refs []lease.Ref
	for i := 2; i < 30; i++ {
		key := "RHEL-" + strconv.Itoa(i)
		if _, err := a.Acquire(ctx, "rebase", key, lease.AcquireOptions{}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, lease.Ref{Agent: "rebase", Issue: key})
	}
	infos, err := a.InspectMany(ctx, refs)
	if err != nil || len(infos) != len(refs) {
		t.Fatalf("InspectMany on the cluster: %d of %d leases, %v", len(infos), len(refs), err)
	}
	// List (behind `ymirflow locks`) SCANs for the lease records: on a cluster it must scan
	// every master, not the one node a ClusterClient sends SCAN to.
	list, err := a.List(ctx, "rebase")
	if err != nil || len(list) != len(refs) {
		t.Errorf("List on the cluster: %d of %d leases, %v", len(list), len(refs), err)
	}

	// An operator's force release: the fence moves on, the evicted holder cannot publish.
	f2, err := b.ForceRelease(ctx, "triage", "RHEL-1")
	if err != nil || f2 <= la.Fence() {
		t.Fatalf("force release: fence %d, %v", f2, err)
	}
	if _, err := la.XAdd(ctx, "ymir:rebase:c9s", 0, map[string]any{"w": "a-late"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("publish after a force release: %v, want ErrLeaseLost", err)
	}
	redistest.Eventually(t, 2*ttl, func() bool { return la.Err() != nil }, "the evicted holder notices")

	// Coalesce: a conflicting event is queued and published by the next release.
	lb, err := b.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "2-0", Drain: true})
	if err != nil || lb.Fence() <= f2 {
		t.Fatalf("re-acquire after the force release: %v (fence %d, want > %d)", err, lb.Fence(), f2)
	}
	_, err = a.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "3-0",
		Queue: &lease.QueuedEvent{Stream: "ymir:triage", Fields: map[string]any{"payload": "follow-up", "m:issue_key": "RHEL-1"}}})
	if !errors.As(err, &locked) || !locked.Queued {
		t.Fatalf("coalesce: %v, want a queued LockedError", err)
	}
	if _, err := lb.Release(ctx); err != nil {
		t.Fatalf("release with drain: %v", err)
	}
	id := lb.Requeued()
	if msgs := rdb.XRange(ctx, "ymir:triage", "-", "+").Val(); id == "" || len(msgs) != 1 || msgs[0].ID != id {
		t.Fatalf("the queued follow-up was not published on release: requeued %q, stream %v", id, msgs)
	}

	// Superseded: an event that entered its stream before another event's run ended.
	_, err = a.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "4-0",
		EntryTime: time.Now().Add(-time.Minute)})
	var sup *lease.SupersededError
	if !errors.As(err, &sup) {
		t.Fatalf("an event older than the last release: %v, want a SupersededError", err)
	}
	gslots := groupScopeOnCluster(t, rdb, a, b)
	t.Logf("cluster lock suite: slot %d for every key of lease triage:RHEL-1; fences %d → %d (force release) → %d; "+
		"of %d leases across 3 masters, InspectMany saw %d and List %d; follow-up %s published on release; "+
		"scope group: agent key in slot %d, group keys in %d and %d", slot,
		la.Fence(), f2, lb.Fence(), len(refs), len(infos), len(list), id, gslots[0], gslots[1], gslots[2])
}

// groupScopeOnCluster (issue 34, item 2): under scope group an agent's own key for an
// issue is one whatever the event's group value. Two events of one issue with two
// group values never hold at once and share one fence sequence; the group keys, in
// slots of their own, are extended and released with the lease. It returns the slots
// of the agent's key and of the two group keys.
func groupScopeOnCluster(t *testing.T, rdb *redis.ClusterClient, a, b *lease.Locker) [3]int64 {
	t.Helper()
	ctx := context.Background()
	group := func(k string) []lease.ScopeKey { return []lease.ScopeKey{{Scope: lease.ScopeGroup, Key: k}} }
	first, err := a.Acquire(ctx, "backport", "RHEL-50", lease.AcquireOptions{MessageID: "5-0", Shared: group("OPENSSL")})
	if err != nil {
		t.Fatal(err)
	}
	var locked *lease.LockedError
	_, err = b.Acquire(ctx, "backport", "RHEL-50", lease.AcquireOptions{MessageID: "6-0", Shared: group("ZLIB")})
	if !errors.As(err, &locked) || locked.Holder.Scope != lease.ScopeAgent || locked.Holder.MessageID != "5-0" {
		t.Fatalf("scope group: another group value of RHEL-50: %v, want the agent's key busy with 5-0", err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return time.Since(first.AcquiredAt()) > 3*a.TTL() }, "three TTLs")
	if err := first.Err(); err != nil {
		t.Fatalf("scope group: the heartbeat did not keep the lease and its group key: %v", err)
	}
	if _, err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := b.Acquire(ctx, "backport", "RHEL-50", lease.AcquireOptions{MessageID: "6-0", Shared: group("ZLIB")})
	if err != nil || second.Fence() != first.Fence()+1 || second.Keys().Fence != first.Keys().Fence {
		t.Fatalf("scope group: after the release: %v, want the next fence of %s", err, first.Keys().Fence)
	}
	if _, err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, le := range []*lease.Lease{first, second} {
		if n := rdb.Exists(ctx, le.Keys().Lock, le.Shared()[0].Keys.Lock).Val(); n != 0 {
			t.Fatalf("scope group: %d keys of %s left after the release", n, le.Keys().Lock)
		}
	}
	return [3]int64{rdb.ClusterKeySlot(ctx, first.Keys().Lock).Val(), rdb.ClusterKeySlot(ctx, first.Shared()[0].Keys.Lock).Val(),
		rdb.ClusterKeySlot(ctx, second.Shared()[0].Keys.Lock).Val()}
}

// TestClusterNodeOnATakenPortIsReported: a node whose port was taken after it was found
// free exits at once; startNode says so (and startCluster then picks another port)
// rather than waiting 10 s for a server that is gone.
func TestClusterNodeOnATakenPortIsReported(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stop, err := startNode(t, l.Addr().(*net.TCPAddr).Port)
	if err == nil {
		stop()
		t.Fatal("a node started on a port another listener holds")
	}
	if !strings.Contains(err.Error(), "exited before it answered") {
		t.Fatalf("want the exit reported: %v", err)
	}
}
