package lease_test

import (
	"cmp"
	"context"
	"errors"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// newLocker returns a Locker whose keys live in this test's namespace:
// lock:<ns>triage:RHEL-123 and so on.
func newLocker(t testing.TB, rdb redis.UniversalClient, ns string, o lease.Options) *lease.Locker {
	t.Helper()
	o.Scope = ns
	l, err := lease.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustAcquire(t testing.TB, l *lease.Locker, agent, key string) *lease.Lease {
	t.Helper()
	le, err := l.Acquire(context.Background(), agent, key, lease.AcquireOptions{})
	if err != nil {
		t.Fatalf("acquire %s %s: %v", agent, key, err)
	}
	t.Cleanup(func() { le.Release(context.Background()) })
	return le
}

func get(t testing.TB, rdb redis.UniversalClient, key string) string {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func exists(t testing.TB, rdb redis.UniversalClient, key string) bool {
	t.Helper()
	n, err := rdb.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// --- The 21 tests of the Python lock (ymir/common/tests/unit/test_issue_lock.py), against a real Redis. ---

func TestAcquireSucceedsOnEmptyKey(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	if got := get(t, rdb, "lock:"+ns+"triage:RHEL-123"); got != le.Token() {
		t.Fatalf("lock key holds %q, want the token %q", got, le.Token())
	}
	if ttl := rdb.PTTL(context.Background(), "lock:"+ns+"triage:RHEL-123").Val(); ttl <= 0 || ttl > lease.DefaultTTL {
		t.Fatalf("PTTL = %s, want in (0, %s]", ttl, lease.DefaultTTL)
	}
}

func TestAcquireFailsWhenAlreadyHeld(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{Owner: "worker-a"})
	first := mustAcquire(t, l, "triage", "RHEL-123")
	_, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{Owner: "worker-b"})
	var locked *lease.LockedError
	if !errors.Is(err, lease.ErrLocked) || !errors.As(err, &locked) {
		t.Fatalf("second acquire: err = %v, want ErrLocked", err)
	}
	if locked.Holder.Owner != "worker-a" || locked.Holder.Fence != first.Fence() || locked.Holder.TTL <= 0 {
		t.Fatalf("holder = %+v, want worker-a with fence %d and a TTL", locked.Holder, first.Fence())
	}
	if got := get(t, rdb, "lock:"+ns+"triage:RHEL-123"); got != first.Token() {
		t.Fatalf("stored token changed to %q", got)
	}
}

func TestAcquireSucceedsAfterExpiry(t *testing.T) {
	// Not parallel: measures time: the first acquire must come within the foreign key's 150 ms.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	// A holder that died: its key expires for real, nobody deletes it.
	key := "lock:" + ns + "triage:RHEL-123"
	if err := rdb.Set(context.Background(), key, "dead-holder", 150*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{}); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("acquire while held: %v", err)
	}
	redistest.Eventually(t, 3*time.Second, func() bool { return !exists(t, rdb, key) }, "the key to expire on the server")
	le := mustAcquire(t, l, "triage", "RHEL-123")
	if get(t, rdb, key) != le.Token() {
		t.Fatal("new holder's token not stored")
	}
}

func TestReleaseSucceedsWithMatchingToken(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	deleted, err := le.Release(context.Background())
	if err != nil || !deleted {
		t.Fatalf("release = %v, %v; want true, nil", deleted, err)
	}
	keys := le.Keys()
	if exists(t, rdb, keys.Lock) || exists(t, rdb, keys.Info) {
		t.Fatal("lock or info key left behind")
	}
	if !exists(t, rdb, keys.Fence) {
		t.Fatal("fence counter must outlive the lease")
	}
	if !errors.Is(le.Err(), lease.ErrReleased) {
		t.Fatalf("lease cause = %v, want ErrReleased", le.Err())
	}
}

func TestReleaseFailsWithWrongToken(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	// Our key expired and a foreign holder (say, a Python agent) took it.
	rdb.Set(context.Background(), le.Keys().Lock, "foreign-token", time.Minute)
	deleted, err := le.Release(context.Background())
	if err != nil || deleted {
		t.Fatalf("release = %v, %v; want false, nil", deleted, err)
	}
	if get(t, rdb, le.Keys().Lock) != "foreign-token" {
		t.Fatal("a foreign lock was deleted")
	}
}

func TestReleaseFailsOnExpiredKey(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	rdb.Del(context.Background(), le.Keys().Lock)
	if deleted, err := le.Release(context.Background()); err != nil || deleted {
		t.Fatalf("release = %v, %v; want false, nil", deleted, err)
	}
}

// beats counts the heartbeat's extends through the OnHeartbeat hook, which is called once
// per extend round trip.
type beats struct{ n atomic.Int64 }

func (b *beats) hook(context.Context, redis.Pipeliner) { b.n.Add(1) }

func TestExtendSucceedsWithMatchingToken(t *testing.T) {
	// Not parallel: measures time: a 300 ms TTL must outlive nine heartbeats on time.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 300 * time.Millisecond})
	var b beats
	le, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{OnHeartbeat: b.hook})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	// Three TTLs later the key is still there, only because extends succeeded.
	redistest.Eventually(t, 5*time.Second, func() bool { return b.n.Load() >= 9 }, "9 heartbeats")
	if !exists(t, rdb, le.Keys().Lock) || le.Err() != nil {
		t.Fatalf("lease gone after extends: exists=%v err=%v", exists(t, rdb, le.Keys().Lock), le.Err())
	}
	if ttl := rdb.PTTL(context.Background(), le.Keys().Info).Val(); ttl <= 0 {
		t.Fatalf("info hash lost its TTL or expired: %s", ttl)
	}
}

func TestExtendFailsWithWrongToken(t *testing.T) {
	// Not parallel: measures time. The TTL is seconds so that an extend delayed by a busy
	// machine still comes back "not yours" (lost) before the lease could read as unproven.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 3 * time.Second})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	rdb.Set(context.Background(), le.Keys().Lock, "foreign-token", time.Minute)
	<-le.Context().Done()
	if !errors.Is(context.Cause(le.Context()), lease.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", context.Cause(le.Context()))
	}
	if get(t, rdb, le.Keys().Lock) != "foreign-token" {
		t.Fatal("extend touched a foreign lock")
	}
	if ttl := rdb.PTTL(context.Background(), le.Keys().Lock).Val(); ttl < 50*time.Second {
		t.Fatalf("foreign lock's TTL was changed to %s", ttl)
	}
}

func TestExtendFailsOnExpiredKey(t *testing.T) {
	// Not parallel: measures time. The TTL is seconds so that an extend delayed by a busy
	// machine still comes back "not yours" (lost) before the lease could read as unproven.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 3 * time.Second})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	rdb.Del(context.Background(), le.Keys().Lock)
	<-le.Context().Done()
	if !errors.Is(context.Cause(le.Context()), lease.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", context.Cause(le.Context()))
	}
	if exists(t, rdb, le.Keys().Lock) {
		t.Fatal("extend re-created an expired key")
	}
}

func TestHeartbeatCallsExtendPeriodically(t *testing.T) {
	// Not parallel: measures the heartbeat's period. A 600 ms TTL: with 150 ms, an extend
	// late by a busy machine's scheduling ended the lease as unproven before its second beat.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 600 * time.Millisecond})
	var b beats
	start := time.Now()
	le, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{OnHeartbeat: b.hook})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	redistest.Eventually(t, 6*time.Second, func() bool { return b.n.Load() >= 2 }, "two extends")
	// Two beats at TTL/3 = 200ms each cannot come sooner than 400ms.
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Fatalf("two beats after %s: faster than TTL/3", el)
	}
}

func TestHeartbeatStopsWhenLockLost(t *testing.T) {
	// Not parallel: counts the extends of a 150 ms TTL's heartbeat against the clock.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 150 * time.Millisecond})
	var b beats
	le, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{OnHeartbeat: b.hook})
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(context.Background(), le.Keys().Lock)
	<-le.Context().Done()
	n := b.n.Load()
	if n != 1 {
		t.Fatalf("extends before noticing the loss = %d, want exactly 1", n)
	}
	time.Sleep(200 * time.Millisecond) // four intervals: no beat may come
	if b.n.Load() != n {
		t.Fatalf("heartbeat kept going after loss: %d extends", b.n.Load())
	}
}

func TestHeartbeatSurvivesRedisError(t *testing.T) {
	// Not parallel: measures time: a 1.2 s outage of its own redis-server against a 3 s TTL.
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rdb := srv.Client()
	ns := redistest.Namespace()
	l := newLocker(t, rdb, ns, lease.Options{TTL: 3 * time.Second})
	var b beats
	le, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{OnHeartbeat: b.hook})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	// A blip shorter than the TTL: down for 1.2 s, across at least one beat (1 s).
	srv.Stop()
	time.Sleep(1200 * time.Millisecond)
	srv.Start()
	before := b.n.Load()
	redistest.Eventually(t, 5*time.Second, func() bool { return b.n.Load() >= before+2 }, "extends after the restart")
	if le.Err() != nil {
		t.Fatalf("a blip shorter than the TTL cancelled the lease: %v", le.Err())
	}
	if get(t, rdb, le.Keys().Lock) != le.Token() {
		t.Fatal("lease key not ours after the blip")
	}
}

func TestHeartbeatIsCleanlyCancellable(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 60 * time.Second})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	done := make(chan struct{})
	go func() { le.Release(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Release did not return while the heartbeat was sleeping a 20s interval")
	}
}

func TestAcquireAndReleaseOnNormalExit(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "RHEL-123")
	if get(t, rdb, le.Keys().Lock) != le.Token() {
		t.Fatal("key does not hold the token inside the block")
	}
	le.Release(context.Background())
	if exists(t, rdb, le.Keys().Lock) {
		t.Fatal("key left after a normal exit")
	}
}

func TestReleaseOnError(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	work := func() (err error) {
		le, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{})
		if err != nil {
			return err
		}
		defer le.Release(context.Background())
		return errors.New("boom")
	}
	if err := work(); err == nil || err.Error() != "boom" {
		t.Fatalf("error did not propagate: %v", err)
	}
	if exists(t, rdb, "lock:"+ns+"triage:RHEL-123") {
		t.Fatal("lock left after an error")
	}
}

func TestReleaseOnCancellation(t *testing.T) {
	t.Parallel()
	// The holder's context cancelled, or its deadline passed (a lease carries its
	// context's values, not its deadline: the deadline's passing ends it all the same).
	for _, tc := range []struct {
		name    string
		timeout time.Duration // 0: cancelled instead
		cause   error
	}{
		{"cancelled", 0, context.Canceled},
		{"deadline", 100 * time.Millisecond, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			l := newLocker(t, rdb, ns, lease.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(tc.timeout, time.Hour))
			defer cancel()
			le, err := l.Acquire(ctx, "triage", "RHEL-123", lease.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.timeout == 0 {
				cancel()
			}
			select {
			case <-le.Context().Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the lease outlived its holder's context")
			}
			if cause := context.Cause(le.Context()); !errors.Is(cause, tc.cause) {
				t.Fatalf("lease context: %v, want %v", cause, tc.cause)
			}
			// The release must still work with the holder's context gone.
			if deleted, err := le.Release(context.Background()); !deleted || err != nil {
				t.Fatalf("release after cancellation = %v, %v", deleted, err)
			}
		})
	}
}

func TestYieldsLockedWhenHeldByForeignKey(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	key := "lock:" + ns + "triage:RHEL-123"
	rdb.Set(context.Background(), key, "python-agent-token", time.Minute)
	_, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{})
	if !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
	if get(t, rdb, key) != "python-agent-token" {
		t.Fatal("foreign key touched")
	}
}

func TestTwoConcurrentLocksOnSameIssue(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	var wins, busy atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			le, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{})
			if errors.Is(err, lease.ErrLocked) {
				busy.Add(1)
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			wins.Add(1)
			t.Cleanup(func() { le.Release(context.Background()) })
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || busy.Load() != 15 {
		t.Fatalf("wins=%d busy=%d, want 1 and 15", wins.Load(), busy.Load())
	}
}

func TestDifferentIssuesDoNotConflict(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	a := mustAcquire(t, l, "triage", "RHEL-111")
	b := mustAcquire(t, l, "triage", "RHEL-222")
	if a.Token() == b.Token() {
		t.Fatal("tokens must differ")
	}
	a.Release(context.Background())
	b.Release(context.Background())
	if exists(t, rdb, a.Keys().Lock) || exists(t, rdb, b.Keys().Lock) {
		t.Fatal("a key survived its release")
	}
}

func TestCustomPrefix(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "rebase", "RHEL-123")
	if le.Keys().Lock != "lock:"+ns+"rebase:RHEL-123" || !exists(t, rdb, le.Keys().Lock) {
		t.Fatalf("lock key %q not created", le.Keys().Lock)
	}
	if exists(t, rdb, "lock:"+ns+"triage:RHEL-123") {
		t.Fatal("the triage key was created for a rebase lease")
	}
	le.Release(context.Background())
	if exists(t, rdb, le.Keys().Lock) {
		t.Fatal("rebase key not released")
	}
}

func TestDifferentPrefixesDoNotConflict(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	a := mustAcquire(t, l, "triage", "RHEL-123")
	b := mustAcquire(t, l, "rebase", "RHEL-123")
	if a.Token() == b.Token() {
		t.Fatal("tokens must differ")
	}
}

// --- What the Python tests missed. ---

func TestCanonicalKeys(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "  rhel-123\t")
	if le.Issue() != "RHEL-123" || le.Keys().Lock != "lock:"+ns+"triage:RHEL-123" {
		t.Fatalf("issue %q key %q, want RHEL-123", le.Issue(), le.Keys().Lock)
	}
	for _, spelling := range []string{"RHEL-123", "rhel-123", " Rhel-123 "} {
		if _, err := l.Acquire(context.Background(), "triage", spelling, lease.AcquireOptions{}); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("%q: err = %v, want ErrLocked (same canonical key)", spelling, err)
		}
	}
}

func TestInvalidKeysTouchNoRedisKey(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	bad := []string{"", "   ", "../x", "RHEL 123", "RHEL-12 3", strings.Repeat("A", 296) + "-123",
		"RHEL-1\x00", "RHEL\x07-1", "RHEL-0", "123-RHEL", "-1", "RHEL-", "lock:triage:RHEL-1", "RHEL-1*"}
	for _, k := range bad {
		_, err := l.Acquire(context.Background(), "triage", k, lease.AcquireOptions{})
		if !errors.Is(err, lease.ErrInvalidKey) {
			t.Errorf("%q: err = %v, want ErrInvalidKey", k, err)
		}
	}
	if keys := rdb.Keys(context.Background(), "*"+ns+"*").Val(); len(keys) != 0 {
		t.Fatalf("invalid keys created Redis keys: %v", keys)
	}
}

func TestKeyPatternConfigurable(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{KeyPattern: regexp.MustCompile(`^ISSUE[0-9]+$`)})
	if _, err := l.Acquire(context.Background(), "triage", "RHEL-1", lease.AcquireOptions{}); !errors.Is(err, lease.ErrInvalidKey) {
		t.Fatalf("RHEL-1 under a custom pattern: %v", err)
	}
	le := mustAcquire(t, l, "triage", "issue42")
	if le.Issue() != "ISSUE42" {
		t.Fatalf("issue = %q", le.Issue())
	}
}

func TestClusterKeysShareOneHashTag(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{Format: lease.KeysCluster})
	k := l.Keys("triage", "RHEL-123")
	for _, key := range []string{k.Lock, k.Info, k.Fence, k.Queue, k.Done, k.Mailbox, k.Stop} {
		if !strings.Contains(key, "{"+ns+"triage:RHEL-123}") || strings.Count(key, "{") != 1 {
			t.Fatalf("%q does not carry the one hash tag {%striage:RHEL-123}", key, ns)
		}
	}
	le := mustAcquire(t, l, "triage", "RHEL-123")
	if le.Keys().Lock != "lock:{"+ns+"triage:RHEL-123}" || get(t, rdb, le.Keys().Lock) != le.Token() {
		t.Fatalf("cluster lease key %q", le.Keys().Lock)
	}
	if _, err := l.Acquire(context.Background(), "triage", "RHEL-123", lease.AcquireOptions{}); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("second acquire: %v", err)
	}
	le.Release(context.Background())
	if exists(t, rdb, le.Keys().Lock) {
		t.Fatal("cluster lease not released")
	}
}

func TestLeaseRecordForOperators(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	before := time.Now().Add(-time.Second)
	le, err := l.Acquire(context.Background(), "triage", "RHEL-9", lease.AcquireOptions{Owner: "pod-7-0", MessageID: "1700000000000-3"})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	info, ok, err := l.Inspect(context.Background(), "triage", "rhel-9")
	if err != nil || !ok {
		t.Fatalf("inspect = %v, %v", ok, err)
	}
	if info.Owner != "pod-7-0" || info.Fence != le.Fence() || info.MessageID != "1700000000000-3" ||
		info.AcquiredAt.Before(before) || info.TTL <= 0 {
		t.Fatalf("record = %+v", info)
	}
	le.Release(context.Background())
	if _, ok, _ := l.Inspect(context.Background(), "triage", "RHEL-9"); ok {
		t.Fatal("inspect finds a released lease")
	}
}

func TestFencesStrictlyIncrease(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 150 * time.Millisecond})
	var last int64
	for i := range 5 {
		le := mustAcquire(t, l, "triage", "RHEL-5")
		if le.Fence() <= last {
			t.Fatalf("acquire %d: fence %d not above %d", i, le.Fence(), last)
		}
		last = le.Fence()
		if i%2 == 0 {
			le.Release(context.Background())
		} else { // an expired holder: the key goes away without a release
			rdb.Del(context.Background(), le.Keys().Lock, le.Keys().Info)
			<-le.Context().Done()
		}
	}
}

func TestFencedPublishRefusedAfterLoss(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	le := mustAcquire(t, l, "triage", "RHEL-7")
	stream := ns + "out"
	if _, err := le.XAdd(context.Background(), stream, 0, map[string]any{"fence": le.Fence()}); err != nil {
		t.Fatalf("publish under a live lease: %v", err)
	}
	newFence, err := l.ForceRelease(context.Background(), "triage", "RHEL-7")
	if err != nil || newFence <= le.Fence() {
		t.Fatalf("force release = %d, %v; want a fence above %d", newFence, err, le.Fence())
	}
	if _, err := le.XAdd(context.Background(), stream, 0, map[string]any{"late": "1"}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("publish after force release: %v, want ErrLeaseLost", err)
	}
	if err := le.Check(context.Background()); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("check after force release: %v", err)
	}
	if n := rdb.XLen(context.Background(), stream).Val(); n != 1 {
		t.Fatalf("stream has %d entries, want only the fenced one", n)
	}
	next := mustAcquire(t, l, "triage", "RHEL-7")
	if next.Fence() <= newFence {
		t.Fatalf("next fence %d not above the forced %d", next.Fence(), newFence)
	}
}

type countingObserver struct {
	mu                       sync.Mutex
	acquired, busy, released int
	lost                     []error
}

func (o *countingObserver) Acquired(string)                 { o.mu.Lock(); o.acquired++; o.mu.Unlock() }
func (o *countingObserver) Busy(string)                     { o.mu.Lock(); o.busy++; o.mu.Unlock() }
func (o *countingObserver) Conflict(string, string, string) {}
func (o *countingObserver) Lost(_ string, c error) {
	o.mu.Lock()
	o.lost = append(o.lost, c)
	o.mu.Unlock()
}
func (o *countingObserver) Released(string, time.Duration) { o.mu.Lock(); o.released++; o.mu.Unlock() }

func TestLossCancelsLoggedAndCounted(t *testing.T) {
	// Not parallel: it waits on a heartbeat. The TTL is seconds, not a fraction of
	// one: under load a 300 ms TTL's extend came late enough to read as unproven, and
	// the loss under test is the extend's "not yours".
	rdb, ns := redistest.Client(t)
	var logs testlog.Buffer
	obs := &countingObserver{}
	l := newLocker(t, rdb, ns, lease.Options{TTL: 3 * time.Second, Logger: zerolog.New(&logs), Observer: obs})
	le := mustAcquire(t, l, "triage", "RHEL-77")
	rdb.Del(context.Background(), le.Keys().Lock) // stolen behind the holder's back
	select {
	case <-le.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease context not cancelled after the key vanished")
	}
	if !errors.Is(context.Cause(le.Context()), lease.ErrLeaseLost) {
		t.Fatalf("cause = %v", context.Cause(le.Context()))
	}
	out := logs.String()
	if !strings.Contains(out, `"level":"error"`) || !strings.Contains(out, `"issue_key":"RHEL-77"`) || !strings.Contains(out, `"agent":"triage"`) {
		t.Fatalf("loss not logged at error level with fields: %s", out)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.lost) != 1 || !errors.Is(obs.lost[0], lease.ErrLeaseLost) || obs.acquired != 1 {
		t.Fatalf("observer: %+v", obs)
	}
}

func TestMaxHold(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: 3 * time.Second, MaxHold: 300 * time.Millisecond})
	start := time.Now()
	le := mustAcquire(t, l, "triage", "RHEL-8")
	<-le.Context().Done()
	if !errors.Is(context.Cause(le.Context()), lease.ErrMaxHold) {
		t.Fatalf("cause = %v, want ErrMaxHold", context.Cause(le.Context()))
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("max hold fired after %s", el)
	}
	// A wedged holder that never releases: its key is no longer extended and expires.
	redistest.Eventually(t, 6*time.Second, func() bool { return !exists(t, rdb, le.Keys().Lock) }, "wedged holder's key to expire")
}

func TestUnprovenWhenRedisUnreachable(t *testing.T) {
	// Not parallel: measures time: the lease must be given up within its TTL.
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rdb := srv.Client()
	ns := redistest.Namespace()
	ttl := 900 * time.Millisecond
	l := newLocker(t, rdb, ns, lease.Options{TTL: ttl})
	le, err := l.Acquire(context.Background(), "triage", "RHEL-10", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	srv.Stop()
	select {
	case <-le.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not given up while Redis was unreachable")
	}
	if !errors.Is(context.Cause(le.Context()), lease.ErrLeaseUnproven) {
		t.Fatalf("cause = %v, want ErrLeaseUnproven", context.Cause(le.Context()))
	}
	// It must give up before the key could have expired on the server, not long after.
	if el := time.Since(start); el > ttl {
		t.Fatalf("gave up after %s, later than the TTL %s", el, ttl)
	}
}

func TestReleaseFailureWhenRedisDownIsSwallowedAndKeyExpires(t *testing.T) {
	// Not parallel: measures time: its own redis-server must restart within the key's 2 s TTL.
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	ns := redistest.Namespace()
	var logs testlog.Buffer
	l := newLocker(t, rdb, ns, lease.Options{TTL: 2 * time.Second, Logger: zerolog.New(&logs)})
	le, err := l.Acquire(context.Background(), "triage", "RHEL-11", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	deleted, err := le.Release(ctx)
	if err == nil || deleted {
		t.Fatalf("release with Redis down = %v, %v; want an error", deleted, err)
	}
	if !strings.Contains(logs.String(), "expire by its TTL") {
		t.Fatalf("release failure not logged: %s", logs.String())
	}
	srv.Start() // AOF brought the key back; nobody extends it any more
	check := srv.Client()
	if !exists(t, check, le.Keys().Lock) {
		t.Fatal("expected the AOF to keep the unreleased key")
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return !exists(t, check, le.Keys().Lock) }, "the unreleased key to expire")
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Client(t)
	for _, o := range []lease.Options{{TTL: -time.Second}, {MaxHold: -time.Hour}, {TTL: time.Second, SafetyMargin: time.Second}} {
		if _, err := lease.New(rdb, o); err == nil {
			t.Errorf("New(%+v) accepted bad config", o)
		}
	}
}

// Redis hangs (no answer, connections open): the lease is given up on time, whatever
// the client's own read timeout.
func TestUnprovenWhenRedisHangs(t *testing.T) {
	// Not parallel: measures time: the lease must be given up within its TTL.
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true, ReadTimeout: 10 * time.Second})
	defer rdb.Close()
	ttl := 900 * time.Millisecond
	l := newLocker(t, rdb, redistest.Namespace(), lease.Options{TTL: ttl})
	le, err := l.Acquire(context.Background(), "triage", "RHEL-12", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	srv.Pause()
	defer srv.Resume()
	select {
	case <-le.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not given up while Redis hung")
	}
	if el := time.Since(start); el > ttl || !errors.Is(context.Cause(le.Context()), lease.ErrLeaseUnproven) {
		t.Fatalf("gave up after %s (TTL %s) with %v", el, ttl, context.Cause(le.Context()))
	}
}

// LockKey is the Lock name of Keys, in both formats (the fetcher relies on it).
func TestLockKeyMatchesKeys(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	for _, f := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		l := newLocker(t, rdb, ns, lease.Options{Format: f})
		if got, want := l.LockKey("rebase", "RHEL-7"), l.Keys("rebase", "RHEL-7").Lock; got != want {
			t.Fatalf("format %d: LockKey %q, Keys().Lock %q", f, got, want)
		}
	}
}

// The hand-written matcher used for DefaultKeyPattern agrees with the regexp.
func TestDefaultPatternMatcherAgreesWithRegexp(t *testing.T) {
	t.Parallel()
	custom := regexp.MustCompile(lease.DefaultKeyPattern.String()) // another pointer: the regexp path
	for _, k := range []string{"RHEL-1", "RHEL-10", "A-9", "A_B9-123", "RHEL-0", "RHEL-01", "RHEL-", "-1", "1A-1",
		"RHEL-1-2", "RHEL_X-5", "rhel-1", "R-1a", "RH EL-1", "RHEL--1", "Ä-1", "RHEL-1\n", "_A-1", "AB", ""} {
		_, got := lease.Canonicalize(k, nil)
		_, want := lease.Canonicalize(k, custom)
		if (got == nil) != (want == nil) {
			t.Errorf("%q: default pattern err %v, regexp err %v", k, got, want)
		}
	}
}

// A lease costs no goroutine until its first extend is due: most events end in
// milliseconds, long before TTL/3.
// Unbind unties a lease from the context it was acquired under: that context's end
// (a message acked while its run's release waits for a batch) leaves it held, and it
// ends released.
func TestUnboundLeaseOutlivesItsContext(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	le, err := l.Acquire(ctx, "triage", "RHEL-123", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	le.Unbind()
	cancel()
	if redistest.Within(100*time.Millisecond, func() bool { return !le.Held() }) {
		t.Fatalf("an unbound lease ended with its context: %v", context.Cause(le.Context()))
	}
	if deleted, err := le.Release(context.Background()); !deleted || err != nil {
		t.Fatalf("release = %v, %v", deleted, err)
	}
	if cause := context.Cause(le.Context()); !errors.Is(cause, lease.ErrReleased) {
		t.Fatalf("the lease ended with %v, want %v", cause, lease.ErrReleased)
	}
}

func TestHeldLeaseStartsNoGoroutineBeforeFirstExtend(t *testing.T) {
	// Not parallel: counts the process's goroutines, which parallel tests would change.
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: time.Minute})
	before := runtime.NumGoroutine()
	var leases []*lease.Lease
	for i := range 200 {
		leases = append(leases, mustAcquire(t, l, "triage", "RHEL-"+strconv.Itoa(i+1)))
	}
	if grown := runtime.NumGoroutine() - before; grown > 20 {
		t.Fatalf("200 fresh leases added %d goroutines", grown)
	}
	for _, le := range leases {
		if _, err := le.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// The superseded check compares an event's stream id (which never decreases) with the
// server time of the last release. When the server's clock has been stepped back since
// that release, the two cannot be compared: the event runs rather than being dropped
// for a run that may have ended before it entered. Once the clock has caught up, the
// check applies again.
func TestSupersededSurvivesAClockStepBack(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	ctx := context.Background()
	done := l.Keys("triage", "RHEL-1").Done
	now := rdb.Time(ctx).Val()
	// The last release, recorded by a clock ten minutes ahead of the server's now: as
	// the server sees it after its clock was stepped back ten minutes.
	ahead := now.Add(10 * time.Minute).UnixMilli()
	rdb.Set(ctx, done, strconv.FormatInt(ahead, 10)+" 1-0 0", time.Hour)
	le, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "2-0", EntryTime: now})
	if err != nil {
		t.Fatalf("an event after a clock step back: %v, want it to run", err)
	}
	if _, err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A release recorded in the server's past still supersedes older events.
	past := now.Add(-time.Minute)
	rdb.Set(ctx, done, strconv.FormatInt(now.UnixMilli(), 10)+" 2-0 0", time.Hour)
	_, err = l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "3-0", EntryTime: past})
	var sup *lease.SupersededError
	if !errors.As(err, &sup) {
		t.Fatalf("an event older than the last release: %v, want a SupersededError", err)
	}
}
