package lease_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func groupKey(key string) []lease.ScopeKey {
	return []lease.ScopeKey{{Scope: lease.ScopeGroup, Key: key}}
}

// Issue 34, item 2: under scope group, an agent's own key for an issue (its lock key
// and its fence counter) is the same whatever the group value of the event, on both
// key formats. Two events of one issue with different group values never hold at once
// and share one fence sequence; on Cluster the agent's keys are Keys(agent, issue) (a
// group key is in its own slot, taken by a script of its own).
func TestGroupScopeKeepsOneAgentKey(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]lease.KeyFormat{"compat": lease.KeysCompat, "cluster keys": lease.KeysCluster} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			checkGroupScopeOneAgentKey(t, rdb, newLocker(t, rdb, ns, lease.Options{Format: f, TTL: 300 * time.Millisecond}))
		})
	}
}

// The same on a real Redis Cluster (one primary owning every slot): it refuses a
// script whose keys are in two slots (CROSSSLOT), so every step of a group-scoped
// lease — acquire, a busy group key's give-back, extend, release — is shown to touch
// one slot at a time.
func TestGroupScopeOnRealCluster(t *testing.T) {
	t.Parallel()
	cc := startCluster(t)
	l, err := lease.New(cc, lease.Options{Format: lease.KeysCluster, TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkGroupScopeOneAgentKey(t, cc, l)
}

func checkGroupScopeOneAgentKey(t *testing.T, rdb redis.UniversalClient, l *lease.Locker) {
	t.Helper()
	ctx := context.Background()
	acquire := func(issue, group, mid string) (*lease.Lease, error) {
		return l.Acquire(ctx, "rebase", issue, lease.AcquireOptions{Shared: groupKey(group), MessageID: mid})
	}
	first, err := acquire("RHEL-1", "OPENSSL", "1-0")
	if err != nil {
		t.Fatal(err)
	}
	// Another event of the issue, another group value: the agent's key is busy.
	_, err = acquire("RHEL-1", "ZLIB", "2-0")
	var locked *lease.LockedError
	if !errors.As(err, &locked) || locked.Holder.Scope != lease.ScopeAgent || locked.Holder.MessageID != "1-0" {
		t.Fatalf("second group value of one issue: %v, want the agent's key busy with the first event", err)
	}
	if exists(t, rdb, l.SharedKeys(groupKey("ZLIB")[0]).Lock) {
		t.Fatal("the refused event took its group key")
	}
	if own := l.Keys("rebase", "RHEL-1"); first.Keys().Lock != own.Lock || first.Keys().Fence != own.Fence {
		t.Fatalf("agent keys %s %s, want Keys(agent, issue): %s %s", first.Keys().Lock, first.Keys().Fence, own.Lock, own.Fence)
	}
	if _, err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := acquire("RHEL-1", "ZLIB", "2-0")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if second.Keys().Fence != first.Keys().Fence || second.Fence() != first.Fence()+1 {
		t.Fatalf("fence %d on %s after %d on %s: want one sequence", second.Fence(), second.Keys().Fence, first.Fence(), first.Keys().Fence)
	}
	// A busy group key: the other issue's agent key is given back, with no release
	// record (no run happened under it).
	_, err = acquire("RHEL-2", "ZLIB", "3-0")
	if !errors.As(err, &locked) || locked.Holder.Scope != lease.ScopeGroup || locked.Holder.Issue != "RHEL-1" {
		t.Fatalf("busy group key: %v, want it named with its holder's issue", err)
	}
	if own := l.Keys("rebase", "RHEL-2"); exists(t, rdb, own.Lock) || exists(t, rdb, own.Info) || exists(t, rdb, own.Done) {
		t.Fatal("the agent's key of a refused event was kept, or its give-back recorded a release")
	}
	// Both the agent's key and the group key are extended: the lease outlives its TTL.
	ttl := l.TTL()
	redistest.Eventually(t, 10*time.Second, func() bool { return time.Since(second.AcquiredAt()) > 3*ttl }, "three TTLs")
	if err := second.Err(); err != nil {
		t.Fatalf("lease ended after %s: %v", time.Since(second.AcquiredAt()), err)
	}
	sk := second.Shared()[0].Keys
	if !exists(t, rdb, sk.Lock) || !exists(t, rdb, second.Keys().Lock) {
		t.Fatal("a key of the lease expired while it was held")
	}
	if _, err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(t, rdb, sk.Lock) || exists(t, rdb, sk.Info) || exists(t, rdb, second.Keys().Lock) {
		t.Fatal("keys left after the release")
	}
	// A group key that is no longer ours ends the lease at its next extend.
	third, err := acquire("RHEL-2", "ZLIB", "4-0")
	if err != nil {
		t.Fatal(err)
	}
	defer third.Release(ctx)
	if err := rdb.Del(ctx, third.Shared()[0].Keys.Lock).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return third.Err() != nil }, "the lease to end")
	if err := third.Err(); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("lease ended with %v, want ErrLeaseLost", err)
	}
}

// startCluster starts a one-primary Redis Cluster owning every slot and returns a
// cluster client on it.
func startCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	ctx := context.Background()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}
	srv := redistest.StartServer(t, redistest.ServerOptions{Args: args})
	c := srv.Client()
	if err := c.Do(ctx, "cluster", "addslotsrange", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 15*time.Second, func() bool {
		info, _ := c.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok")
	}, "the cluster to be ok")
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}, DisableIdentity: true})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// The scripts of a group key held apart (cluster key format) are safe to repeat: each
// of the lease's own acquire, the group key's acquire and its release has its reply
// lost once and go-redis sends it again. The acquire returns the lease the first try
// made, fences 1 and 1 (not busy with its own token, not given back); the release
// leaves nothing.
func TestGroupScopeClusterScriptsSafeToRepeat(t *testing.T) {
	t.Parallel()
	direct, ns := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	rdb := proxy.Client(direct.Options())
	l := newLocker(t, rdb, ns, lease.Options{TTL: 5 * time.Second, Format: lease.KeysCluster})
	ctx := context.Background()
	script := func(names ...string) string {
		var b strings.Builder
		b.WriteString(xonce.IndexLua) // before lease.lua, as the package puts them
		for _, n := range names {
			src, err := os.ReadFile("scripts/" + n)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(src)
		}
		return b.String()
	}
	proxy.LoseReply(redistest.Script(script("lease.lua", "acquire_scoped.lua")), 1)
	proxy.LoseReply(redistest.Script(script("lease.lua", "acquire_shared.lua")), 1)
	le, err := l.Acquire(ctx, "rebase", "RHEL-40", lease.AcquireOptions{Shared: groupKey("PKG"), MessageID: "1-0"})
	if err != nil {
		t.Fatalf("acquire after lost replies: %v", err)
	}
	if proxy.Cuts() != 2 {
		t.Fatalf("cuts = %d, want 2", proxy.Cuts())
	}
	if le.Fence() != 1 || le.Shared()[0].Fence != 1 {
		t.Errorf("fences after repeated acquires: %d %+v, want 1 and 1", le.Fence(), le.Shared())
	}
	sk := le.Shared()[0].Keys
	if get(t, direct, le.Keys().Lock) != le.Token() || get(t, direct, sk.Lock) != le.Token() {
		t.Fatal("the lease or its group key is not held with the lease's token")
	}
	proxy.LoseReply(redistest.Script(script("lease.lua", "unlock_shared.lua")), 1)
	if _, err := le.Release(ctx); err != nil {
		t.Fatalf("release after a lost reply: %v", err)
	}
	if proxy.Cuts() != 3 {
		t.Fatalf("cuts = %d, want 3", proxy.Cuts())
	}
	if exists(t, direct, sk.Lock) || exists(t, direct, sk.Info) || exists(t, direct, le.Keys().Lock) {
		t.Error("keys left after the release")
	}
}
