package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Issue 37, item 1 with every scope: an event whose lease holds a shared key waits in
// that key's line, whatever agent (scope issue) or issue (scope group) holds it; the
// holder's release hands the shared key to the head in its own script(s), the head's
// copy takes both its keys, the line shows on the shared key's record (locks), and a
// redelivered copy of a finished event is acked, not run. On both key formats of a
// standalone server, and on a real Redis Cluster, which refuses a script whose keys
// span two slots (the group key is held apart from the agents' keys there).
func TestWaitLineOnSharedKey(t *testing.T) {
	t.Parallel()
	issue := []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-1"}}
	group := []lease.ScopeKey{{Scope: lease.ScopeGroup, Key: "OPENSSL|C9S"}}
	for _, f := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		t.Run(fmt.Sprintf("issue format %d", f), func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			checkSharedLine(t, rdb, newLocker(t, rdb, ns, lease.Options{Format: f, TTL: 2 * time.Second}), ns, issue, "backport", "RHEL-1")
		})
		t.Run(fmt.Sprintf("group format %d", f), func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			checkSharedLine(t, rdb, newLocker(t, rdb, ns, lease.Options{Format: f, TTL: 2 * time.Second}), ns, group, "rebase", "RHEL-2")
		})
	}
	t.Run("real cluster", func(t *testing.T) {
		t.Parallel()
		cc := startCluster(t)
		for i, sk := range [][]lease.ScopeKey{issue, group} {
			l := newLocker(t, cc, "", lease.Options{Format: lease.KeysCluster, TTL: 2 * time.Second})
			agent, key := "backport", "RHEL-1"
			if i == 1 {
				agent, key = "rebase", "RHEL-2"
			}
			checkSharedLine(t, cc, l, "{s"+string(sk[0].Scope)+"}", sk, agent, key)
		}
	})
}

// checkSharedLine: rebase on RHEL-1 holds the shared key sk; agent's event on key waits
// in sk's line and runs once rebase's run ends.
func checkSharedLine(t *testing.T, rdb redis.UniversalClient, l *lease.Locker, ns string, sk []lease.ScopeKey, agent, key string) {
	t.Helper()
	ctx := context.Background()
	sl := &sharedLine{rdb: rdb, l: l, stream: ns + "stream", sk: sk}
	if err := rdb.XGroupCreateMkStream(ctx, sl.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// 1. rebase holds sk; agent's event waits first in its line.
	first := sl.add(t)
	holder, err := sl.acquire(ctx, "rebase", "RHEL-1", first, first)
	if err != nil {
		t.Fatal(err)
	}
	waiter := sl.add(t)
	sl.checkWaiting(t, agent, key, waiter)
	// 2. rebase's release hands sk to the head and appends its copy.
	copyID := sl.checkHandOff(t, holder, first, waiter, agent, key)
	// 3. The head's copy takes its keys and runs; a redelivered copy is acked, not run.
	sl.checkCopyRuns(t, agent, key, copyID, waiter)
}

// sharedLine is the fixture of checkSharedLine: a stream with group "g" and a Locker
// whose events hold the shared key sk.
type sharedLine struct {
	rdb    redis.UniversalClient
	l      *lease.Locker
	stream string
	sk     []lease.ScopeKey
}

// add appends an entry to the stream and returns its id.
func (sl *sharedLine) add(t *testing.T) string {
	t.Helper()
	id, err := sl.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: sl.stream, Values: map[string]any{"n": 1}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// acquire takes ag's lease on issue for the entry id of line lid, with the shared key
// (under scope issue, the issue's own).
func (sl *sharedLine) acquire(ctx context.Context, ag, issue, id, lid string) (*lease.Lease, error) {
	ao := waitOpts(sl.stream, id, lid, 10)
	ao.Shared = sl.sk
	if sl.sk[0].Scope == lease.ScopeIssue {
		ao.Shared = []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: issue}}
	}
	return sl.l.Acquire(ctx, ag, issue, ao)
}

// checkWaiting: agent's event on key (entry waiter) waits first in sk's line behind
// rebase, and SharedLines and List show it.
func (sl *sharedLine) checkWaiting(t *testing.T, agent, key, waiter string) {
	t.Helper()
	ctx := context.Background()
	sk := sl.sk
	_, err := sl.acquire(ctx, agent, key, waiter, waiter)
	var locked *lease.LockedError
	if !errors.As(err, &locked) || !locked.Waited || locked.Position != 1 || locked.Line != sk[0] ||
		locked.Holder.Agent != "rebase" || locked.Holder.Scope != sk[0].Scope {
		t.Fatalf("the second event: %v (%+v), want it waiting first in %v's line behind rebase", err, locked, sk[0])
	}
	if ws, err := sl.l.SharedLines(ctx, sk[0]); err != nil || len(ws) != 1 || ws[0].LineID != waiter {
		t.Fatalf("SharedLines: %+v %v", ws, err)
	}
	if infos, err := sl.l.List(ctx, ""); err != nil || !sharedWaiting(infos, sk[0], 1) {
		t.Fatalf("List does not show the shared key's line: %+v %v", infos, err)
	}
}

// checkHandOff: the holder's release (of entry first) wakes waiter and reserves sk for
// the head (agent, key); it returns the id of the head's copy the release appended.
func (sl *sharedLine) checkHandOff(t *testing.T, holder *lease.Lease, first, waiter, agent, key string) string {
	t.Helper()
	ctx := context.Background()
	sk := sl.sk
	if err := holder.FinishedForTest(ctx, lease.Entry{Stream: sl.stream, Group: "g", ID: first}); err != nil {
		t.Fatal(err)
	}
	if holder.Woke() != waiter {
		t.Fatalf("the release woke %q, want %s", holder.Woke(), waiter)
	}
	if in, ok, err := sl.l.InspectShared(ctx, sk[0]); err != nil || !ok || !in.Reserved || in.Agent != agent || in.Issue != key {
		t.Fatalf("the shared key reserved for the head: %+v %v %v, want it named %s %s", in, ok, err, agent, key)
	}
	// The head's copy, appended by the release (in its script on standalone Redis).
	msgs, err := sl.rdb.XRange(ctx, sl.stream, "("+waiter, "+").Result()
	if err != nil || len(msgs) != 1 || msgs[0].Values["lid"] != waiter {
		t.Fatalf("the head's copy: %+v %v", msgs, err)
	}
	return msgs[0].ID
}

// checkCopyRuns: the head's copy (entry copyID of line waiter) takes both its keys and
// finishes; a redelivered copy is then refused as Ran, and sk is free.
func (sl *sharedLine) checkCopyRuns(t *testing.T, agent, key, copyID, waiter string) {
	t.Helper()
	ctx := context.Background()
	sk := sl.sk
	cp, err := sl.acquire(ctx, agent, key, copyID, waiter)
	if err != nil {
		t.Fatalf("the head's copy takes its keys: %v", err)
	}
	if len(cp.Shared()) != 1 || cp.Shared()[0].ScopeKey != sk[0] || cp.Agent() != agent {
		t.Fatalf("the copy's lease %+v", cp.Shared())
	}
	if err := cp.FinishedForTest(ctx, lease.Entry{Stream: sl.stream, Group: "g", ID: copyID}); err != nil {
		t.Fatal(err)
	}
	_, err = sl.acquire(ctx, agent, key, copyID, waiter)
	var locked *lease.LockedError
	if !errors.As(err, &locked) || !locked.Ran {
		t.Fatalf("a redelivered copy of the finished event: %v, want Ran", err)
	}
	if n, _ := sl.rdb.Exists(ctx, sl.l.SharedKeys(sk[0]).Lock).Result(); n != 0 {
		t.Fatalf("the shared key is still held after the line emptied")
	}
}

func sharedWaiting(infos []lease.Info, sk lease.ScopeKey, n int64) bool {
	for _, in := range infos {
		if in.Scope == sk.Scope && in.Key == sk.Key {
			return in.Waiting == n
		}
	}
	return false
}

// Events of one line that entered two streams with one entry id wait as two events, and
// each runs in its turn: two agents' on an issue's shared key, and an agent's own key's
// events of its stream and of its :todo twin (a worker reads both). The lines named a
// member by its entry id alone: they took the second for a repeat of the first, which
// its caller acks and never runs (found by lockmw's model, once it drove shared keys'
// lines and the :todo twin).
func TestLinesTellApartTwoStreamsEntriesOfOneID(t *testing.T) {
	t.Parallel()
	shared := []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-1"}}
	cases := []struct {
		name    string
		sk      []lease.ScopeKey
		holder  string    // the holder's agent and stream
		waiters [2]string // the waiters' agents and streams
		agents  [2]string
	}{
		{"issue key, two agents", shared, "rebase", [2]string{"backport", "triage"}, [2]string{"backport", "triage"}},
		{"agent key, a stream and its todo twin", nil, "rebase", [2]string{"rebase", "rebase:todo"}, [2]string{"rebase", "rebase"}},
	}
	for _, c := range cases {
		for _, f := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
			t.Run(fmt.Sprintf("%s format %d", c.name, f), func(t *testing.T) {
				t.Parallel()
				rdb, ns := redistest.Client(t)
				l := newLocker(t, rdb, ns, lease.Options{Format: f, TTL: 2 * time.Second})
				checkTwoStreamsOneID(t, rdb, l, ns, c.sk, c.holder, c.waiters, c.agents)
			})
		}
	}
}

// checkTwoStreamsOneID: holder's run (of stream ns+holder) holds RHEL-1; the events
// 5-1 of streams ns+waiters[i] (agents[i]'s) wait, and run one after the other.
func checkTwoStreamsOneID(t *testing.T, rdb *redis.Client, l *lease.Locker, ns string, sk []lease.ScopeKey, holder string, waiters, agents [2]string) {
	t.Helper()
	ctx := context.Background()
	acquire := func(agent, stream, id, lid string) (*lease.Lease, error) {
		ao := waitOpts(ns+stream, id, lid, 10)
		ao.Shared = sk
		return l.Acquire(ctx, agent, "RHEL-1", ao)
	}
	for _, stream := range []string{holder, waiters[0], waiters[1]} {
		if err := rdb.XGroupCreateMkStream(ctx, ns+stream, "g", "0").Err(); err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			t.Fatal(err)
		}
	}
	add := func(stream, id string) {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: ns + stream, ID: id, Values: map[string]any{"n": 1}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add(holder, "1-1")
	prev, err := acquire(holder, holder, "1-1", "1-1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range waiters {
		add(waiters[i], "5-1")
		_, err := acquire(agents[i], waiters[i], "5-1", "5-1")
		var locked *lease.LockedError
		if !errors.As(err, &locked) || !locked.Waited || locked.Duplicate || locked.Position != int64(i+1) {
			t.Fatalf("5-1 of %s: %v (%+v), want it waiting at %d", waiters[i], err, locked, i+1)
		}
	}
	// Each in its turn: the release hands the key to the head and appends its copy to
	// its stream; the copy takes the key, runs, and hands on.
	prevEntry := lease.Entry{Stream: ns + holder, Group: "g", ID: "1-1"}
	ran := map[string]bool{}
	for range waiters {
		if err := prev.FinishedForTest(ctx, prevEntry); err != nil {
			t.Fatal(err)
		}
		if prev.Woke() != "5-1" {
			t.Fatalf("the release woke %q, want 5-1 (ran so far: %v)", prev.Woke(), ran)
		}
		next := -1
		for i, w := range waiters {
			if msgs, _ := rdb.XRange(ctx, ns+w, "(5-1", "+").Result(); !ran[w] && len(msgs) == 1 {
				next = i
				prevEntry = lease.Entry{Stream: ns + w, Group: "g", ID: msgs[0].ID}
			}
		}
		if next < 0 {
			t.Fatalf("no copy of 5-1 appended to a stream that has not run yet (ran: %v)", ran)
		}
		ran[waiters[next]] = true
		if prev, err = acquire(agents[next], waiters[next], prevEntry.ID, "5-1"); err != nil {
			t.Fatalf("the copy of 5-1 in %s takes its turn: %v", waiters[next], err)
		}
	}
	if err := prev.FinishedForTest(ctx, prevEntry); err != nil {
		t.Fatal(err)
	}
	if len(ran) != 2 {
		t.Fatalf("ran %v, want both", ran)
	}
}
