package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A batch dates each release by when its run ended (End.EndedAt), not by when the
// batch was sent: an event of the issue that entered its stream after the run ended
// is not superseded by it, and one that entered before is.
func TestBatchDatesReleaseByRunEnd(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLocker(t, rdb, ns, lease.Options{})
	stream := ns + "s"
	rdb.XGroupCreateMkStream(ctx, stream, "g", "$")
	run := func(issue string) (*lease.Lease, lease.Entry) {
		id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"k": "v"}}).Val()
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}}).Err(); err != nil {
			t.Fatal(err)
		}
		le, err := l.Acquire(ctx, "triage", issue, lease.AcquireOptions{MessageID: id})
		if err != nil {
			t.Fatal(err)
		}
		return le, lease.Entry{Stream: stream, Group: "g", ID: id}
	}
	a, ea := run("RHEL-1")
	b, eb := run("RHEL-2")
	now := time.Now()
	ends := []lease.End{{Lease: a, Entry: ea, EndedAt: now.Add(-400 * time.Millisecond)}, {Lease: b, Entry: eb, EndedAt: now}}
	next := func(issue, id string, entered time.Time) lease.Next {
		return lease.Next{Agent: "triage", Key: issue, Options: lease.AcquireOptions{MessageID: id, EntryTime: entered}}
	}
	// RHEL-1's next entered after its run ended (200 ms ago, the run 400 ms ago);
	// RHEL-2's entered before its run ended.
	ps, err := l.HandoffBatch(ctx, ends, []lease.Next{
		next("RHEL-1", "1-1", now.Add(-200*time.Millisecond)),
		next("RHEL-2", "1-2", now.Add(-200*time.Millisecond)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if le, err := ps[0].Take(ctx); err != nil {
		t.Fatalf("RHEL-1's next, entered after the run ended: %v, want the lease", err)
	} else {
		defer le.Release(ctx)
	}
	if _, err := ps[1].Take(ctx); !errors.As(err, new(*lease.SupersededError)) {
		t.Fatalf("RHEL-2's next, entered before the run ended: %v, want superseded", err)
	}
	if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 0 {
		t.Fatalf("%d entries pending, want both acked", n)
	}
}

// A lease taken ahead is a plain one: a Next that asks for a policy's acquire (or for
// slots) is refused, and nothing is taken for it.
func TestTakeAheadRefusesPolicyOptions(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := newLocker(t, rdb, ns, lease.Options{})
	for name, o := range map[string]lease.AcquireOptions{
		"supersede": {MessageID: "1-1", Supersede: true},
		"line":      {MessageID: "1-1", LineHold: time.Second},
	} {
		ps, err := l.HandoffBatch(ctx, nil, []lease.Next{{Agent: "triage", Key: "RHEL-1", Options: o}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ps[0].Take(ctx); err == nil {
			t.Errorf("%s: a lease taken ahead with a policy's options", name)
		}
		if _, held, _ := l.Inspect(ctx, "triage", "RHEL-1"); held {
			t.Errorf("%s: the key was taken", name)
		}
	}
}
