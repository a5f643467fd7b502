package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func TestParseScopes(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"":                 "agent",
		"agent":            "agent",
		" issue ":          "agent,issue",
		"agent,issue":      "agent,issue",
		"issue,agent":      "agent,issue",
		"group:m:lock_key": "agent,group:m:lock_key",
		"group:metadata.component + metadata.target_branch,issue": "agent,issue,group:metadata.component+metadata.target_branch",
	}
	for in, want := range good {
		sc, err := lease.ParseScopes(in)
		if err != nil {
			t.Errorf("ParseScopes(%q): %v", in, err)
			continue
		}
		if sc.String() != want {
			t.Errorf("ParseScopes(%q) = %s, want %s", in, sc, want)
		}
		if back, err := lease.ParseScopes(sc.String()); err != nil || back.String() != want {
			t.Errorf("ParseScopes(%q) does not read back: %v %v", sc, back, err)
		}
	}
	bad := map[string]string{
		"agents":                "is not agent, issue or group",
		"issue,issue":           "given twice",
		"group":                 "needs field paths",
		"group:":                "needs field paths",
		"group:a..b":            "field path",
		"group:a+":              "field path",
		"group:m:":              "metadata name",
		"group:a,group:b":       "given twice",
		"issue:x":               "is not agent, issue or group",
		"group:metadata.a b":    "field path",
		"group:m:lock key":      "metadata name",
		"group:metadata.$where": "field path",
	}
	for in, want := range bad {
		_, err := lease.ParseScopes(in)
		if err == nil || !errors.Is(err, lease.ErrBadScope) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseScopes(%q) = %v, want an ErrBadScope saying %q", in, err, want)
		}
	}
}

func TestScopesKeys(t *testing.T) {
	t.Parallel()
	sc, err := lease.ParseScopes("issue,group:metadata.component+metadata.target_branch+m:lock_key")
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"metadata":{"component":" openssl ","target_branch":"rhel-9.4.0","n":3}}`)
	meta := map[string]string{"lock_key": "cve-2026-1"}
	keys, err := sc.Keys("RHEL-1", payload, func(k string) string { return meta[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-1"}, {Scope: lease.ScopeGroup, Key: "OPENSSL|RHEL-9.4.0|CVE-2026-1"}}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("keys = %v, want %v", keys, want)
	}
	num, _ := lease.ParseScopes("group:metadata.n")
	if keys, err := num.Keys("RHEL-1", payload, nil); err != nil || keys[0].Key != "3" {
		t.Errorf("a number is a group value: %v %v", keys, err)
	}
	for name, p := range map[string]string{
		"missing field": `{"metadata":{"component":"x"}}`,
		"empty value":   `{"metadata":{"component":"","target_branch":"b"}}`,
		"object value":  `{"metadata":{"component":{},"target_branch":"b"}}`,
		"bad character": `{"metadata":{"component":"a:b","target_branch":"b"}}`,
		"not json":      `{`,
	} {
		g, _ := lease.ParseScopes("group:metadata.component+metadata.target_branch")
		if _, err := g.Keys("RHEL-1", []byte(p), nil); !errors.Is(err, lease.ErrInvalidKey) {
			t.Errorf("%s: err = %v, want ErrInvalidKey", name, err)
		}
	}
	m, _ := lease.ParseScopes("group:m:lock_key")
	if _, err := m.Keys("RHEL-1", nil, func(string) string { return "" }); !errors.Is(err, lease.ErrInvalidKey) {
		t.Errorf("missing metadata: err = %v, want ErrInvalidKey", err)
	}
}

// issueScope is the shared key of issue.
func issueScope(issue string) []lease.ScopeKey {
	return []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: issue}}
}

func TestSharedIssueKeyExcludesOtherAgents(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second})
	ctx := context.Background()
	reb, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Shared: issueScope("RHEL-1"), MessageID: "1-1", Owner: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	shared := l.SharedKeys(lease.ScopeKey{Scope: lease.ScopeIssue, Key: "RHEL-1"})
	if shared.Lock != "lock:"+ns+"@issue:RHEL-1" {
		t.Errorf("shared lock key = %q", shared.Lock)
	}
	if got := get(t, rdb, shared.Lock); got != reb.Token() {
		t.Fatalf("shared key holds %q, want the lease's token", got)
	}
	if len(reb.Shared()) != 1 || reb.Shared()[0].Fence != 1 {
		t.Fatalf("shared = %+v, want one with fence 1", reb.Shared())
	}

	// backport with scope issue: refused, naming the rebase run.
	_, err = l.Acquire(ctx, "backport", "RHEL-1", lease.AcquireOptions{Shared: issueScope("RHEL-1"), MessageID: "2-1"})
	var locked *lease.LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("backport acquire: %v, want a LockedError", err)
	}
	h := locked.Holder
	if h.Scope != lease.ScopeIssue || h.Key != "RHEL-1" || h.Agent != "rebase" || h.Issue != "RHEL-1" || h.Owner != "w1" || h.MessageID != "1-1" {
		t.Errorf("holder = %+v", h)
	}
	if locked.Issue != "RHEL-1" {
		t.Errorf("LockedError.Issue = %q", locked.Issue)
	}
	if exists(t, rdb, l.Keys("backport", "RHEL-1").Lock) {
		t.Error("the refused acquire left backport's own key behind (not all or nothing)")
	}
	// backport without the scope does not share the key.
	bp := mustAcquire(t, l, "backport", "RHEL-1")
	if _, err := bp.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Another issue is free.
	other, err := l.Acquire(ctx, "backport", "RHEL-2", lease.AcquireOptions{Shared: issueScope("RHEL-2")})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = other.Release(ctx)

	// The operators' view lists the shared key with its holder.
	infos, err := l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range infos {
		got = append(got, fmt.Sprintf("%s %s %s %s fence=%d", i.Agent, i.Issue, i.Scope, i.Key, i.Fence))
	}
	want := []string{"rebase RHEL-1 agent RHEL-1 fence=1", "rebase RHEL-1 issue RHEL-1 fence=1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %q, want %q", got, want)
	}
	if in, ok, err := l.InspectShared(ctx, lease.ScopeKey{Scope: lease.ScopeIssue, Key: "RHEL-1"}); err != nil || !ok || in.Agent != "rebase" || in.TTL <= 0 {
		t.Errorf("InspectShared = %+v %v %v", in, ok, err)
	}

	// Release frees both; the next holder's shared fence is higher, whatever its agent.
	if _, err := reb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(t, rdb, shared.Lock) || exists(t, rdb, shared.Info) {
		t.Fatal("release left the shared key")
	}
	bp2, err := l.Acquire(ctx, "backport", "RHEL-1", lease.AcquireOptions{Shared: issueScope("RHEL-1")})
	if err != nil {
		t.Fatal(err)
	}
	defer bp2.Release(ctx)
	if f := bp2.Shared()[0].Fence; f != 2 {
		t.Errorf("backport's shared fence = %d, want 2 (rebase had 1)", f)
	}
}

func TestSharedKeyLostEndsLease(t *testing.T) {
	// Not parallel: a sub-second TTL, timed against the heartbeat.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 300 * time.Millisecond, SafetyMargin: 30 * time.Millisecond})
	ctx := context.Background()
	le, err := l.Acquire(ctx, "rebase", "RHEL-3", lease.AcquireOptions{Shared: issueScope("RHEL-3")})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	// The heartbeat keeps the shared key alive past its TTL.
	shared := l.SharedKeys(lease.ScopeKey{Scope: lease.ScopeIssue, Key: "RHEL-3"})
	time.Sleep(600 * time.Millisecond) // two TTLs: the heartbeat must have extended the shared key
	if get(t, rdb, shared.Lock) != le.Token() || le.Err() != nil {
		t.Fatalf("shared key not kept alive: %q, lease err %v", get(t, rdb, shared.Lock), le.Err())
	}
	// Someone takes the shared key: the lease is lost at its next extend.
	rdb.Set(ctx, shared.Lock, "intruder", time.Minute)
	redistest.Eventually(t, 2*time.Second, func() bool { return le.Err() != nil }, "lease not ended after its shared key was taken")
	if !errors.Is(le.Err(), lease.ErrLeaseLost) {
		t.Errorf("cause = %v, want ErrLeaseLost", le.Err())
	}
	if _, err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if get(t, rdb, shared.Lock) != "intruder" {
		t.Error("release deleted a shared key it did not hold")
	}
}

// TestScopeIssueNeverOverlaps: rebase and backport workers (goroutines) with scope
// issue race for a handful of issues; each win is timed into a ledger between Acquire
// and Release. No two wins on one issue may overlap, whatever the agent, and the shared
// fence grows with every win.
func TestScopeIssueNeverOverlaps(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second})
	issues := []string{"RHEL-10", "RHEL-11", "RHEL-12"}
	var inside [3]atomic.Int32
	var wins, overlaps atomic.Int64
	var lastFence [3]atomic.Int64
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for w := range 8 {
		agent := []string{"rebase", "backport"}[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for time.Now().Before(deadline) {
				i := rand.IntN(len(issues))
				le, err := l.Acquire(ctx, agent, issues[i], lease.AcquireOptions{Shared: issueScope(issues[i])})
				if errors.Is(err, lease.ErrLocked) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if inside[i].Add(1) != 1 {
					overlaps.Add(1)
				}
				if f := le.Shared()[0].Fence; f <= lastFence[i].Load() {
					t.Errorf("%s: shared fence %d not above the last %d", issues[i], f, lastFence[i].Load())
				} else {
					lastFence[i].Store(f)
				}
				wins.Add(1)
				time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond) // the hold being timed
				inside[i].Add(-1)
				if _, err := le.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping runs on one issue across agents (of %d)", overlaps.Load(), wins.Load())
	}
	if wins.Load() < 50 {
		t.Errorf("only %d wins: contention starved the test", wins.Load())
	}
	t.Logf("%d wins, none overlapping", wins.Load())
}

// TestScopeGroupSerialisesPackage: a group key of component and branch serialises
// different issues of one package on one branch, and leaves another package (or the same
// package on another branch) free.
func TestScopeGroupSerialisesPackage(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second})
	ctx := context.Background()
	sc, err := lease.ParseScopes("group:metadata.component+metadata.target_branch")
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(agent, issue, component, branch string) (*lease.Lease, error) {
		payload := fmt.Sprintf(`{"metadata":{"jira_issue":%q,"component":%q,"target_branch":%q}}`, issue, component, branch)
		shared, err := sc.Keys(issue, []byte(payload), nil)
		if err != nil {
			t.Fatal(err)
		}
		return l.Acquire(ctx, agent, issue, lease.AcquireOptions{Shared: shared})
	}
	first, err := acquire("backport", "RHEL-20", "openssl", "rhel-9.4")
	if err != nil {
		t.Fatal(err)
	}
	// Another clone of the same package on the same branch: busy, whatever the agent.
	for _, agent := range []string{"backport", "rebase"} {
		_, err = acquire(agent, "RHEL-21", "OpenSSL ", "rhel-9.4")
		var locked *lease.LockedError
		if !errors.As(err, &locked) || locked.Holder.Scope != lease.ScopeGroup || locked.Holder.Key != "OPENSSL|RHEL-9.4" ||
			locked.Holder.Issue != "RHEL-20" || locked.Issue != "RHEL-21" {
			t.Fatalf("%s on RHEL-21: %v (%+v), want busy group OPENSSL|RHEL-9.4 held for RHEL-20", agent, err, locked)
		}
	}
	// Other package, or other branch: parallel.
	for _, c := range [][2]string{{"curl", "rhel-9.4"}, {"openssl", "rhel-10.0"}} {
		le, err := acquire("backport", "RHEL-22", c[0], c[1])
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		_, _ = le.Release(ctx)
	}
	_, _ = first.Release(ctx)
	second, err := acquire("backport", "RHEL-21", "openssl", "rhel-9.4")
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	_, _ = second.Release(ctx)
}

// TestMultiScopeNoDeadlock: runs holding overlapping sets of keys (agent + issue +
// group, in every combination of issues and groups) contend hard; all-or-nothing
// acquires in one script mean nobody waits while holding, so every worker keeps making
// progress and none is stuck.
func TestMultiScopeNoDeadlock(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second})
	groups := []string{"G1", "G2"}
	issues := []string{"RHEL-30", "RHEL-31"}
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	var perWorker [6]atomic.Int64
	var inGroup, inIssue sync.Map
	var overlaps atomic.Int64
	enter := func(m *sync.Map, k string) {
		if _, loaded := m.LoadOrStore(k, true); loaded {
			overlaps.Add(1)
		}
	}
	for w := range 6 {
		agent := []string{"rebase", "backport", "rebuild"}[w%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for time.Now().Before(deadline) {
				issue, group := issues[rand.IntN(2)], groups[rand.IntN(2)]
				shared := []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: issue}, {Scope: lease.ScopeGroup, Key: group}}
				le, err := l.Acquire(ctx, agent, issue, lease.AcquireOptions{Shared: shared})
				if errors.Is(err, lease.ErrLocked) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				enter(&inIssue, issue)
				enter(&inGroup, group)
				perWorker[w].Add(1)
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond) // the hold
				inIssue.Delete(issue)
				inGroup.Delete(group)
				if _, err := le.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("workers stuck: a deadlock")
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping holds of a shared key", overlaps.Load())
	}
	for w := range perWorker {
		if perWorker[w].Load() == 0 {
			t.Errorf("worker %d never won: starved", w)
		}
	}
	// Nothing is left held.
	infos, err := l.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 0 {
		t.Errorf("left held: %+v", infos)
	}
}

// TestScopedScriptsSafeToRepeat: the acquire and the release of a lease with shared
// keys have their reply lost once (the proxy cuts the connection after the server ran
// the script) and go-redis sends them again: the repeated acquire returns the lease the
// first made, with its fences, instead of reporting it busy; the repeated release
// finds everything gone and changes nothing.
func TestScopedScriptsSafeToRepeat(t *testing.T) {
	t.Parallel()
	direct, ns := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	rdb := proxy.Client(direct.Options())
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second})
	ctx := context.Background()
	src, err := os.ReadFile("scripts/lease.lua")
	if err != nil {
		t.Fatal(err)
	}
	acq, _ := os.ReadFile("scripts/acquire_scoped.lua")
	rel, _ := os.ReadFile("scripts/release.lua")
	shared := []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-40"}, {Scope: lease.ScopeGroup, Key: "PKG|B"}}

	proxy.LoseReply(redistest.Script(xonce.IndexLua+string(src)+string(acq)), 1)
	le, err := l.Acquire(ctx, "rebase", "RHEL-40", lease.AcquireOptions{Shared: shared})
	if err != nil {
		t.Fatalf("acquire after a lost reply: %v", err)
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("cuts = %d, want 1", proxy.Cuts())
	}
	if le.Fence() != 1 || len(le.Shared()) != 2 || le.Shared()[0].Fence != 1 || le.Shared()[1].Fence != 1 {
		t.Errorf("fences after a repeated acquire: %d %+v, want all 1", le.Fence(), le.Shared())
	}
	proxy.LoseReply(redistest.Script(xonce.IndexLua+string(src)+string(rel)), 1)
	if _, err := le.Release(ctx); err != nil {
		t.Fatalf("release after a lost reply: %v", err)
	}
	if proxy.Cuts() != 2 {
		t.Fatalf("cuts = %d, want 2", proxy.Cuts())
	}
	for _, sk := range shared {
		if k := l.SharedKeys(sk); exists(t, direct, k.Lock) || exists(t, direct, k.Info) {
			t.Errorf("%s left after the release", k.Lock)
		}
	}
	if exists(t, direct, l.Keys("rebase", "RHEL-40").Lock) {
		t.Error("lease left after the release")
	}
}

func TestScopedClusterKeysShareASlot(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{Format: lease.KeysCluster})
	tag := func(k string) string {
		i, j := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
		if i < 0 || j < i {
			t.Fatalf("%s has no hash tag", k)
		}
		return k[i+1 : j]
	}
	// The issue key is named after the issue alone: the agent's keys join its slot.
	issue := issueScope("RHEL-1")
	own, sk := l.ScopedKeys("rebase", "RHEL-1", issue), l.SharedKeys(issue[0])
	for _, k := range []string{own.Lock, own.Info, own.Fence, own.Done, sk.Lock, sk.Info, sk.Fence} {
		if tag(k) != ns+"@issue:RHEL-1" {
			t.Errorf("%s: tag %q, want the issue key's", k, tag(k))
		}
	}
	// A group key comes from the event: the agent's keys never depend on it (issue 34),
	// they stay Keys(agent, issue), and the group key has a slot of its own.
	shared := []lease.ScopeKey{{Scope: lease.ScopeGroup, Key: "OPENSSL|RHEL-9"}}
	if own := l.ScopedKeys("rebase", "RHEL-1", shared); own != l.Keys("rebase", "RHEL-1") {
		t.Errorf("agent keys under a group key %+v, want Keys(agent, issue)", own)
	}
	if sk := l.SharedKeys(shared[0]); tag(sk.Lock) != ns+"@group:OPENSSL|RHEL-9" || tag(sk.Fence) != tag(sk.Lock) || tag(sk.Info) != tag(sk.Lock) {
		t.Errorf("group key %+v, want its own tag", sk)
	}
	if err := l.CheckScopes(lease.Scopes{Issue: true, Group: []string{"m:k"}}); !errors.Is(err, lease.ErrBadScope) {
		t.Errorf("two shared scopes on Cluster: %v, want ErrBadScope", err)
	}
	if _, err := l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{Shared: append(shared, lease.ScopeKey{Scope: lease.ScopeIssue, Key: "RHEL-1"})}); !errors.Is(err, lease.ErrBadScope) {
		t.Errorf("Acquire with two shared keys on Cluster: %v, want ErrBadScope", err)
	}
	// A lease with a shared key is found by List on Cluster too (standalone Redis
	// accepts the hash-tagged names).
	le, err := l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{Shared: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	infos, err := l.List(context.Background(), "rebase")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range infos {
		got = append(got, fmt.Sprintf("%s %s %s %s", i.Agent, i.Issue, i.Scope, i.Key))
	}
	if want := []string{"rebase RHEL-1 agent RHEL-1", "rebase RHEL-1 group OPENSSL|RHEL-9"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %q, want %q", got, want)
	}
}

func TestSharedRefusesQueue(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	_, err := l.Acquire(context.Background(), "rebase", "RHEL-1", lease.AcquireOptions{Shared: issueScope("RHEL-1"), Drain: true})
	if err == nil || !strings.Contains(err.Error(), "AcquireOptions.Shared") {
		t.Errorf("Shared with Drain: %v", err)
	}
}
