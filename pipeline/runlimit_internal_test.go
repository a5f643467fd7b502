package pipeline

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// The run limit re-queues an entry only while it is pending for the consumer that
// asks: one claimed away by another consumer while it waited in the read-ahead stays
// theirs (not acked, no delayed copy that would run it twice); a second try after the
// first's reply was lost changes nothing.
func TestRequeueOnlyOwnPendingEntry(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	stream, group := ns+"ymir:triage", "triage"
	delayed := delayq.Key(stream)
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	id := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"k": "v"}}).Val()
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "a", Streams: []string{stream, ">"}, Count: 1})
	rdb.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: group, Consumer: "b", Messages: []string{id}})
	run := func(consumer string) int {
		t.Helper()
		n, err := requeueScript.Run(ctx, rdb, []string{stream, delayed}, group, id, consumer, 1, "member").Int()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := run("a"); n != 0 || rdb.ZCard(ctx, delayed).Val() != 0 || rdb.XPending(ctx, stream, group).Val().Count != 1 {
		t.Fatalf("a re-queued b's entry: %d", n)
	}
	if n := run("b"); n != 1 || rdb.ZCard(ctx, delayed).Val() != 1 || rdb.XPending(ctx, stream, group).Val().Count != 0 {
		t.Fatalf("b's own entry not re-queued: %d", n)
	}
	if n := run("b"); n != 0 || rdb.ZCard(ctx, delayed).Val() != 1 {
		t.Fatalf("a second try re-queued again: %d", n)
	}
}
