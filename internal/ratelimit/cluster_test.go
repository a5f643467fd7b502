package ratelimit_test

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// startCluster starts n masters (`redis-server --cluster-enabled yes`), joins them with
// `redis-cli --cluster create`, waits for cluster_state:ok on each, and returns their
// addresses. Everything stops when the test ends.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatal("redis-cli not found on PATH (it creates the cluster); install redis-tools")
	}
	var addrs []string
	for range n {
		// The cluster bus listens on port+10000: take ports whose bus port is free too.
		var port int
		for tries := 0; ; tries++ {
			port = redistest.FreePort(t)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
				_ = l.Close()
				break
			}
			if tries > 100 {
				t.Fatal("no free port pair for a cluster node")
			}
		}
		dir := t.TempDir()
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--save", "", "--protected-mode", "no")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server --cluster-enabled: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		addr := "127.0.0.1:" + strconv.Itoa(port)
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
		redistest.Eventually(t, 10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }, "%s to answer", addr)
		_ = c.Close()
		addrs = append(addrs, addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, DisableIdentity: true})
		redistest.Eventually(t, 20*time.Second, func() bool {
			info, _ := c.ClusterInfo(context.Background()).Result()
			return strings.Contains(info, "cluster_state:ok")
		}, "cluster_state:ok on %s", a)
		_ = c.Close()
	}
	return addrs
}
