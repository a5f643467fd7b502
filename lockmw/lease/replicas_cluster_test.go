package lease_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// On Redis Cluster the WAIT goes to the primary that owns the lease's slot, on the
// connection of the extend before it (a cluster client would send a keyless WAIT to any
// node, or refuse it). A one-primary cluster with one replica: acquires under
// WaitReplicas 1 are confirmed, and refused once the replica is paused.
func TestWaitReplicasOnCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--repl-diskless-sync-delay", "0"}
	primary := redistest.StartServer(t, redistest.ServerOptions{Args: args})
	replica := redistest.StartServer(t, redistest.ServerOptions{Args: args})
	pc, rc := primary.Client(), replica.Client()
	if err := pc.Do(ctx, "cluster", "addslotsrange", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(primary.Port())).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := pc.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 15*time.Second, func() bool {
		return rc.Do(ctx, "cluster", "replicate", id).Err() == nil
	}, "the replica to learn the primary")
	redistest.Eventually(t, 15*time.Second, func() bool {
		info, _ := pc.ClusterInfo(ctx).Result()
		pipe := pc.Pipeline()
		pipe.Set(ctx, "ready", "1", time.Minute)
		n := pipe.Do(ctx, "wait", 1, 100)
		_, err := pipe.Exec(ctx)
		return strings.Contains(info, "cluster_state:ok") && err == nil && n.Val() == int64(1)
	}, "the cluster to be ok and the replica online")

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{primary.Addr()}, DisableIdentity: true})
	defer cc.Close()
	l, err := lease.New(cc, lease.Options{Format: lease.KeysCluster, TTL: 3 * time.Second, WaitReplicas: 1,
		WaitTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		le, err := l.Acquire(ctx, "triage", "RHEL-"+strconv.Itoa(i+1), lease.AcquireOptions{})
		if err != nil {
			t.Fatalf("acquire on the cluster: %v", err)
		}
		// READONLY: a cluster replica answers reads of its primary's slots on this connection.
		pipe := rc.Pipeline()
		pipe.Do(ctx, "readonly")
		get := pipe.Get(ctx, le.Keys().Lock)
		_, _ = pipe.Exec(ctx)
		if got := get.Val(); got != le.Token() {
			t.Fatalf("replica holds %q (%v) right after the acquire, want the token", got, get.Err())
		}
		if _, err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	replica.Pause()
	defer replica.Resume()
	if _, err := l.Acquire(ctx, "triage", "RHEL-9", lease.AcquireOptions{}); !errors.Is(err, lease.ErrNotReplicated) {
		t.Fatalf("acquire on the cluster with the replica paused: %v, want ErrNotReplicated", err)
	}
}
