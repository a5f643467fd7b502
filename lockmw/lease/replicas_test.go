package lease_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// primaryWithReplica starts a private primary and one replica of it, and returns a
// client of each once the replica is online (the primary counts it in WAIT).
func primaryWithReplica(t *testing.T) (primary, replica *redistest.Server, pc, rc *redis.Client) {
	t.Helper()
	// No 5 s wait for more replicas before a diskless full sync.
	primary = redistest.StartServer(t, redistest.ServerOptions{Args: []string{"--repl-diskless-sync-delay", "0"}})
	replica = redistest.StartServer(t, redistest.ServerOptions{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())}})
	pc, rc = primary.Client(), replica.Client()
	redistest.Eventually(t, 10*time.Second, func() bool {
		// A write and a WAIT on its connection: the replica has loaded and applies.
		pipe := pc.Pipeline()
		pipe.Set(context.Background(), "replica-ready", "1", time.Minute)
		wait := pipe.Do(context.Background(), "wait", 1, 100)
		_, err := pipe.Exec(context.Background())
		return err == nil && wait.Val() == int64(1)
	}, "the replica to come online")
	return primary, replica, pc, rc
}

// An acquire that returns under WaitReplicas 1 is on the replica already; one the
// replica cannot acknowledge (paused) is refused with a *NotReplicatedError and given
// back on the primary, so the event can be retried and nobody is left locked out.
func TestWaitReplicasAcquire(t *testing.T) {
	t.Parallel()
	_, replica, pc, rc := primaryWithReplica(t)
	ctx := context.Background()
	l := newLocker(t, pc, "", lease.Options{TTL: 3 * time.Second, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	if n, err := l.CheckReplicas(ctx, l.LockKey("triage", "RHEL-1")); err != nil || n != 1 {
		t.Fatalf("CheckReplicas = %d, %v; want 1 replica", n, err)
	}
	for i := range 20 {
		le, err := l.Acquire(ctx, "triage", "RHEL-"+strconv.Itoa(i+1), lease.AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// WAIT answered: the replica has applied the acquire's writes.
		if got := get(t, rc, le.Keys().Lock); got != le.Token() {
			t.Fatalf("replica holds %q for %s right after the acquire, want the token", got, le.Keys().Lock)
		}
		if _, err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	replica.Pause()
	defer replica.Resume()
	start := time.Now()
	_, err := l.Acquire(ctx, "triage", "RHEL-100", lease.AcquireOptions{})
	var nr *lease.NotReplicatedError
	if !errors.As(err, &nr) || !errors.Is(err, lease.ErrNotReplicated) || nr.Want != 1 || nr.Got != 0 {
		t.Fatalf("acquire with the replica paused: %v, want a NotReplicatedError 0 of 1", err)
	}
	if took := time.Since(start); took < 500*time.Millisecond || took > 3*time.Second {
		t.Errorf("the refused acquire took %s, want about the WAIT timeout (500ms)", took)
	}
	if exists(t, pc, l.LockKey("triage", "RHEL-100")) {
		t.Fatal("a lease the replica did not acknowledge was left on the primary")
	}
	replica.Resume()
	if _, err := l.Acquire(ctx, "triage", "RHEL-100", lease.AcquireOptions{}); err != nil {
		t.Fatalf("the retried acquire once the replica is back: %v", err)
	}
}

// An extend the replica does not acknowledge does not count: the lease ends unproven
// within its TTL (its handler is cancelled), while one whose replica keeps up is held
// across several heartbeats.
func TestWaitReplicasExtend(t *testing.T) {
	t.Parallel()
	_, replica, pc, _ := primaryWithReplica(t)
	ttl := 1500 * time.Millisecond
	l := newLocker(t, pc, "", lease.Options{TTL: ttl, WaitReplicas: 1, WaitTimeout: 400 * time.Millisecond})
	// As a worker would, the acquire is tried again while it is refused: on a loaded
	// machine one WAIT may time out with the replica up (refused and given back).
	var le *lease.Lease
	redistest.Eventually(t, 10*time.Second, func() bool {
		var err error
		le, err = l.Acquire(context.Background(), "triage", "RHEL-7", lease.AcquireOptions{})
		if err != nil && !errors.Is(err, lease.ErrNotReplicated) {
			t.Fatalf("acquire triage RHEL-7: %v", err)
		}
		return err == nil
	}, "an acquire the replica acknowledges")
	select {
	case <-le.Context().Done():
		t.Fatalf("lease ended with its replica up: %v", context.Cause(le.Context()))
	case <-time.After(2 * ttl): // six heartbeats, each with its WAIT
	}
	replica.Pause()
	defer replica.Resume()
	paused := time.Now()
	select {
	case <-le.Context().Done():
	case <-time.After(3 * ttl):
		t.Fatal("lease still held 3 TTLs after its replica stopped acknowledging")
	}
	if cause := context.Cause(le.Context()); !errors.Is(cause, lease.ErrLeaseUnproven) {
		t.Fatalf("cause %v, want ErrLeaseUnproven", cause)
	}
	if took := time.Since(paused); took > ttl+500*time.Millisecond {
		t.Errorf("the lease ended %s after the replica paused, want within the TTL %s", took, ttl)
	}
}

// A lease taken ahead in a hand-off is confirmed by the replicas when its entry takes
// it: refused, and given back, while the replica is paused.
func TestWaitReplicasHandoffTake(t *testing.T) {
	t.Parallel()
	_, replica, pc, _ := primaryWithReplica(t)
	ctx := context.Background()
	l := newLocker(t, pc, "", lease.Options{TTL: 3 * time.Second, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	le := mustAcquire(t, l, "triage", "RHEL-8")
	pre, err := le.Handoff(ctx, lease.Entry{Stream: "s", Group: "g", ID: "1-1"},
		&lease.Next{Agent: "triage", Key: "RHEL-9", Options: lease.AcquireOptions{MessageID: "1-2"}})
	if err != nil || pre.Err() != nil {
		t.Fatalf("handoff: %v / %v", err, pre.Err())
	}
	replica.Pause()
	defer replica.Resume()
	if _, err := pre.Take(ctx); !errors.Is(err, lease.ErrNotReplicated) {
		t.Fatalf("take with the replica paused: %v, want ErrNotReplicated", err)
	}
	if exists(t, pc, l.LockKey("triage", "RHEL-9")) {
		t.Fatal("the lease taken ahead was left on the primary")
	}
}

// The lost-reply case: an acquire whose reply is lost is sent again by go-redis on a
// new connection, and the repeat finds its own token and writes nothing. A WAIT on that
// connection would count no write and answer at once, however far the replica lags.
// The confirmation writes (an extend) before its WAIT, on every try, so a paused
// replica still refuses the lease; with the replica up, a lost reply of the
// confirmation itself is repeated and the lease granted.
func TestWaitReplicasAfterLostReply(t *testing.T) {
	t.Parallel()
	_, replica, pc, rc := primaryWithReplica(t)
	proxy := redistest.NewLossyProxy(t, pc.Options().Addr)
	rdb := proxy.Client(pc.Options())
	ctx := context.Background()
	l := newLocker(t, rdb, "", lease.Options{TTL: 3 * time.Second, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
	lua := func(names ...string) string {
		s := ""
		for _, n := range names {
			b, err := os.ReadFile("scripts/" + n)
			if err != nil {
				t.Fatal(err)
			}
			s += string(b)
		}
		return s
	}
	acquire, extend := xonce.IndexLua+lua("lease.lua", "acquire.lua"), lua("extend.lua")

	replica.Pause()
	proxy.LoseReply(redistest.Script(acquire, "RHEL-11"), 1)
	_, err := l.Acquire(ctx, "triage", "RHEL-11", lease.AcquireOptions{})
	replica.Resume()
	if proxy.Cuts() != 1 {
		t.Fatalf("cuts = %d, want 1", proxy.Cuts())
	}
	if !errors.Is(err, lease.ErrNotReplicated) {
		t.Fatalf("acquire repeated after a lost reply, replica paused: %v, want ErrNotReplicated", err)
	}

	proxy.LoseReply(redistest.Script(acquire, "RHEL-12"), 1)
	proxy.LoseReply(redistest.Script(extend, "RHEL-12"), 1)
	le, err := l.Acquire(ctx, "triage", "RHEL-12", lease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire with both replies lost once, replica up: %v", err)
	}
	defer le.Release(ctx)
	if proxy.Cuts() != 3 {
		t.Fatalf("cuts = %d, want 3", proxy.Cuts())
	}
	if got := get(t, rc, le.Keys().Lock); got != le.Token() {
		t.Fatalf("replica holds %q, want the token", got)
	}
}

// WAITAOF needs Redis 7.2: CheckReplicas says whether the server has it. On an older
// server a Locker with WaitAOF is refused at start (ErrNoWaitAOF), never run with a
// WAITAOF that every acquire would fail on.
func TestWaitAOFDetected(t *testing.T) {
	t.Parallel()
	_, _, pc, _ := primaryWithReplica(t)
	ctx := context.Background()
	l := newLocker(t, pc, "", lease.Options{WaitReplicas: 1, WaitAOF: true})
	has := pc.Do(ctx, "command", "info", "waitaof").Val()
	_, err := l.CheckReplicas(ctx, l.LockKey("triage", "RHEL-1"))
	if list, _ := has.([]any); len(list) > 0 && list[0] != nil {
		if err != nil {
			t.Fatalf("server has WAITAOF, CheckReplicas: %v", err)
		}
		return
	}
	if !errors.Is(err, lease.ErrNoWaitAOF) {
		t.Fatalf("server without WAITAOF, CheckReplicas: %v, want ErrNoWaitAOF", err)
	}
}

func TestWaitOptionsChecked(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Client(t)
	for _, o := range []lease.Options{{WaitReplicas: -1}, {TTL: time.Second, WaitReplicas: 1, WaitTimeout: time.Second}} {
		if _, err := lease.New(rdb, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// Once an acquire was refused for want of replicas, the next ones prove first that the
// replicas acknowledge again and take no lock key while they do not: no fence is taken
// and no key exists for an event of the issue to meet as busy (integration
// TestWaitReplicasUnsatisfied saw "1 lease keys left" this way: a try caught during its
// WAIT). Once the replica is back the first acquire is granted, confirmed as usual.
func TestWaitReplicasLaggingTakesNoKey(t *testing.T) {
	t.Parallel()
	_, replica, pc, rc := primaryWithReplica(t)
	ctx := context.Background()
	l := newLocker(t, pc, "", lease.Options{TTL: 3 * time.Second, WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	keys := l.Keys("triage", "RHEL-1")
	replica.Pause()
	defer replica.Resume()
	if _, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{}); !errors.Is(err, lease.ErrNotReplicated) {
		t.Fatalf("first acquire with the replica paused: %v, want ErrNotReplicated", err)
	}
	fence := get(t, pc, keys.Fence)
	// Sampled while the refused tries wait for the replica: the lock key never appears.
	stop := make(chan struct{})
	seen := make(chan bool, 1)
	go func() {
		appeared := false
		for {
			select {
			case <-stop:
				seen <- appeared
				return
			default:
			}
			appeared = appeared || exists(t, pc, keys.Lock)
			time.Sleep(5 * time.Millisecond) // sampling the key while the acquires wait
		}
	}()
	for range 3 {
		var nr *lease.NotReplicatedError
		if _, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{}); !errors.As(err, &nr) || nr.Lock != keys.Lock {
			t.Fatalf("acquire while the replica lags: %v, want a NotReplicatedError naming %s", err, keys.Lock)
		}
	}
	close(stop)
	if <-seen {
		t.Error("a lock key existed while the replicas were known to lag")
	}
	if got := get(t, pc, keys.Fence); got != fence {
		t.Errorf("fence %s after the refused tries, want %s: a try took a fence", got, fence)
	}
	replica.Resume()
	le, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire once the replica is back: %v", err)
	}
	if got := get(t, rc, keys.Lock); got != le.Token() {
		t.Fatalf("replica holds %q right after the acquire, want the token", got)
	}
}
