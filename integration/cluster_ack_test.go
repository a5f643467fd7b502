package integration

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// holdRelease is a go-redis hook for a cluster's node clients that holds the lease's
// release script until the context ends: the worker freezes, then dies, between its
// release and its ack. The script is told by its digest (EVALSHA) or its source (EVAL),
// as the lease package builds it (releaseScript: xonce's index step, lease.lua, then
// release.lua), not by its keys: another script may have the same keys.
type holdRelease struct {
	sha, src string
	once     sync.Once
	held     chan struct{}
	dead     chan struct{} // closed when the test ends: until then the worker stays frozen
}

// newHoldRelease reads the release script's parts from the lease package's sources.
func newHoldRelease(t *testing.T) *holdRelease {
	var src strings.Builder
	src.WriteString(xonce.IndexLua)
	for _, f := range []string{"lease.lua", "release.lua"} {
		b, err := os.ReadFile(filepath.Join("..", "lockmw", "lease", "scripts", f))
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	sum := sha1.Sum([]byte(src.String()))
	return &holdRelease{sha: hex.EncodeToString(sum[:]), src: src.String(), held: make(chan struct{}), dead: make(chan struct{})}
}

func (h *holdRelease) isRelease(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	script, _ := args[1].(string)
	switch strings.ToLower(fmt.Sprint(args[0])) {
	case "evalsha":
		return script == h.sha
	case "eval":
		return script == h.src
	}
	return false
}

func (h *holdRelease) hold(ctx context.Context) error {
	h.once.Do(func() { close(h.held) })
	<-h.dead
	return errors.New("the worker died here")
}

func (h *holdRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.isRelease(cmd) {
			return h.hold(ctx)
		}
		return next(ctx, cmd)
	}
}
func (h *holdRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if h.isRelease(c) {
				return h.hold(ctx)
			}
		}
		return next(ctx, cmds)
	}
}

type clusterSource struct{ entry lockmw.Entry }

func (s *clusterSource) Entry(*message.Message) (lockmw.Entry, bool)     { return s.entry, true }
func (s *clusterSource) Settle(lockmw.Entry)                             {}
func (s *clusterSource) Encode(*message.Message) (map[string]any, error) { return nil, nil }

// TestClusterAckFollowsRelease: on a 3-master Redis Cluster, where an event's lease and
// its stream entry live on different nodes, a worker that freezes in its release and
// dies there loses nothing: the ack is sent only after the release succeeded, so the
// entry is still pending, and once the dead worker's lease expires another consumer
// claims the entry and runs it. (A cluster pipeline of release and XACK sends each node its
// part concurrently: the ack could land while the release never did, leaving an acked
// entry and a live lease that no pending entry covers.)
func TestClusterAckFollowsRelease(t *testing.T) {
	c := startCluster(t, 3)
	ctx := context.Background()
	check := c.Client()
	defer check.Close()
	hold := newHoldRelease(t)
	t.Cleanup(func() { close(hold.dead) })
	var addrs []string
	for _, p := range c.ports {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	frozen := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableIdentity: true,
		NewClient: func(o *redis.Options) *redis.Client {
			node := redis.NewClient(o)
			node.AddHook(hold) // on each node's client: the cluster splits pipelines per node
			return node
		}})
	defer frozen.Close()
	ttl := time.Second
	newLocker := func(rdb redis.UniversalClient, owner string) *lease.Locker {
		l, err := lease.New(rdb, lease.Options{TTL: ttl, Owner: owner, Format: lease.KeysCluster})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	dead := newLocker(frozen, "dead")
	lockNode, err := check.MasterForKey(ctx, dead.LockKey("triage", "RHEL-1"))
	if err != nil {
		t.Fatal(err)
	}
	stream := ""
	for i := 0; stream == ""; i++ {
		s := "ymir:triage:" + strconv.Itoa(i)
		if n, err := check.MasterForKey(ctx, s); err == nil && n.Options().Addr != lockNode.Options().Addr {
			stream = s
		}
	}
	id := check.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"payload": `{"metadata":{"issue":"RHEL-1"}}`}}).Val()
	check.XGroupCreateMkStream(ctx, stream, "triage", "0")
	if err := check.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "dead-0", Streams: []string{stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	pendingFor := func() string {
		p := check.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "triage", Start: "-", End: "+", Count: 10}).Val()
		if len(p) == 0 {
			return ""
		}
		return p[0].Consumer
	}
	runs := map[string]int{}
	var mu sync.Mutex
	run := func(owner string, l *lease.Locker, consumer string) (chan error, *lockmw.Middleware) {
		mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "triage", MaxIdleTime: time.Hour,
			Source:   &clusterSource{entry: lockmw.Entry{Stream: stream, Group: "triage", Consumer: consumer, ID: id, ReadAt: time.Now()}},
			IssueKey: func(*message.Message) (string, error) { return "RHEL-1", nil }})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := mw.Handler(func(*message.Message) ([]*message.Message, error) {
				mu.Lock()
				runs[owner]++
				mu.Unlock()
				return nil, nil
			})(message.NewMessage("u", []byte("{}")))
			done <- err
		}()
		return done, mw
	}

	first, _ := run("dead", dead, "dead-0")
	select {
	case <-hold.held:
	case <-time.After(10 * time.Second):
		t.Fatalf("the release script (%s) was never sent; the handler returned %v", hold.sha, <-first)
	}
	// Frozen in the release: the ack must not have happened, nor happen.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if pendingFor() != "dead-0" {
			t.Fatalf("entry %s was acked while its lease's release had not run", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The worker dies there, frozen in its release for good.
	_ = first
	// Another consumer claims the entry once the dead worker's lease has expired, and runs it.
	alive := newLocker(check, "alive")
	redistest.Eventually(t, 10*time.Second, func() bool {
		return check.Exists(ctx, alive.LockKey("triage", "RHEL-1")).Val() == 0
	}, "the dead worker's lease expires")
	if err := check.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: "triage", Consumer: "alive-0", Messages: []string{id}}).Err(); err != nil {
		t.Fatal(err)
	}
	second, _ := run("alive", alive, "alive-0")
	if err := <-second; err != nil {
		t.Fatalf("the claimed entry: %v", err)
	}
	if p := pendingFor(); p != "" {
		t.Fatalf("entry still pending for %s after the re-run", p)
	}
	if runs["dead"] != 1 || runs["alive"] != 1 {
		t.Fatalf("runs %v, want one by the dead worker and one by the claimer", runs)
	}
	t.Logf("cluster: lease on %s, entry %s on another node; release frozen then failed, entry left pending; re-run by the claimer after the TTL",
		lockNode.Options().Addr, id)
}
