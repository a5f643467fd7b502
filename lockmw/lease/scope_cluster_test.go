package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
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
