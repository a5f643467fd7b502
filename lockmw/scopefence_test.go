package lockmw_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// A run whose shared key (scope issue) was force-released and taken by another agent's
// run while it went on ends with its lease lost; when its handler still returns
// success, the middleware does not call the run exclusive and ack it (it used to, since
// the release found the run's own key still its own): the entry stays pending.
func TestRunThatLostItsSharedKeyIsNotAcked(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l, err := lease.New(rdb, lease.Options{Scope: ns, TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	scopes, err := lease.ParseScopes("issue")
	if err != nil {
		t.Fatal(err)
	}
	stream := ns + "s"
	id := pendingEntry(t, rdb, stream, "c")
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour, Scopes: scopes})
	if err != nil {
		t.Fatal(err)
	}
	var other *lease.Lease
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		le, _ := lockmw.LeaseFrom(msg.Context())
		if _, err := l.ForceRelease(ctx, "@issue", "RHEL-1"); err != nil {
			t.Error(err)
		}
		var err error
		if other, err = l.Acquire(ctx, "backport", "RHEL-1", lease.AcquireOptions{Shared: []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-1"}}}); err != nil {
			t.Error(err)
			return nil, nil
		}
		if err := le.Check(ctx); !errors.Is(err, lease.ErrLeaseLost) {
			t.Errorf("check after the shared key was taken: %v", err)
		}
		// The heartbeat finds the shared key not ours; the handler, unaware, succeeds.
		<-msg.Context().Done()
		return nil, nil
	})
	if _, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err == nil {
		t.Error("the run that lost its shared key returned no error")
	}
	if other == nil {
		t.FailNow()
	}
	defer other.Release(ctx)
	if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 1 {
		t.Errorf("%d entries pending, want the run's entry left pending", n)
	}
	if err := other.Check(ctx); err != nil {
		t.Errorf("the other run's lease: %v", err)
	}
}
