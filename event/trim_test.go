package event_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
)

// Trimming never removes an entry a group still needs (pending, or not yet delivered),
// while a plain XADD MAXLEN would. Streams are trimmed by whole macro nodes (100
// entries by default), so the test uses a thousand.
func TestTrimSparesPendingAndUndelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	s := e.triage()
	if err := e.rdb.XGroupCreateMkStream(ctx, s, "triage", "0").Err(); err != nil {
		t.Fatal(err)
	}
	pipe := e.rdb.Pipeline()
	for range 1000 {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"payload": "{}"}})
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.(*redis.StringCmd).Val()
	}
	// Deliver the first 600 and ack all of them but 505 and 506, which stay pending;
	// 600..999 are not delivered yet.
	got, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triage", Consumer: "c", Streams: []string{s, ">"}, Count: 600}).Result()
	if err != nil || len(got[0].Messages) != 600 {
		t.Fatalf("read: %v", err)
	}
	for i, m := range got[0].Messages {
		if i != 505 && i != 506 {
			e.rdb.XAck(ctx, s, "triage", m.ID)
		}
	}
	removed, err := event.Trim(ctx, e.rdb, s, 10)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, m := range e.rdb.XRange(ctx, s, "-", "+").Val() {
		have[m.ID] = true
	}
	for _, id := range append([]string{ids[505], ids[506]}, ids[600:]...) {
		if !have[id] {
			t.Fatalf("trim removed %s, which a group still needs", id)
		}
	}
	if removed < 300 {
		t.Fatalf("trim removed only %d acked entries below the floor", removed)
	}
	if p := e.rdb.XPending(ctx, s, "triage").Val(); p.Count != 2 {
		t.Fatalf("pending after trim: %+v", p)
	}
}

// A stream nobody reads yet is not trimmed: every entry is still to be delivered.
func TestTrimSparesStreamWithoutGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pipe := e.rdb.Pipeline()
	for range 1000 {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: map[string]any{"payload": "{}"}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := event.Trim(ctx, e.rdb, e.triage(), 10); err != nil || n != 0 {
		t.Fatalf("trimmed %d (%v) from a stream no group has read", n, err)
	}
}
