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

// A mailbox outlives the run that left follow-ups in it, however long the event its
// release republished waits in a backlog: it used to expire MaxHold+TTL after its last
// append (under a second after a run held for MaxHold), and the follow-ups went with it,
// never read nor recorded. It now lives at least a day, and the republished event's run
// reads them.
func TestMailboxOutlivesTheBacklogOfItsRepublishedEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{TTL: time.Second, MaxHold: time.Second})
	stream := ns + "triage"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	holder, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "1-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": 1}}).Val()
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}})
	var locked *lease.LockedError
	if _, err := l.Acquire(ctx, "triage", "RHEL-1", deliverOpts(stream, id, 10, "a comment")); !errors.As(err, &locked) || !locked.Delivered {
		t.Fatalf("follow-up: %v", err)
	}
	if _, err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	republished := holder.Requeued()
	if republished == "" {
		t.Fatal("the release republished nothing")
	}
	mailbox := l.Keys("triage", "RHEL-1").Mailbox
	if ttl := rdb.PTTL(ctx, mailbox).Val(); ttl < 24*time.Hour {
		t.Fatalf("the mailbox expires in %s while its event waits in the stream; want at least a day", ttl)
	}
	next, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: republished, Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if fu, err := next.Mailbox(ctx, "", 0); err != nil || len(fu) != 1 || fu[0].Fields["body"] != "a comment" {
		t.Fatalf("the republished event's run reads %+v, %v; want the follow-up", fu, err)
	}
}
