package lockmw_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// serverNow is the Redis server's clock.
func serverNow(t *testing.T, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// A delay is due D (plus its jitter) after the conflict by the server's clock, the
// clock that promotes it, whatever the worker's clock says: a worker ten minutes
// behind does not make the event due at once, nor one ten minutes ahead late.
func TestDelayIsDueByTheServersClockWhateverTheWorkers(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{-10 * time.Minute, 10 * time.Minute} {
		t.Run(offset.String(), func(t *testing.T) {
			t.Parallel()
			rdb, ns := redistest.Client(t)
			l := locker(t, rdb, ns)
			ctx := context.Background()
			stream := ns + "s"
			id := pendingEntry(t, rdb, stream, "c")
			holder, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Owner: "holder", MessageID: "1-1"})
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Release(ctx)
			const d = 2 * time.Second
			var until time.Time
			src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
			mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
				Now:      func() time.Time { return time.Now().Add(offset) },
				Policies: lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Delay, Delay: d, MaxDelay: d}},
				OnConflict: func(_ context.Context, _ redis.Pipeliner, c lockmw.Conflict) {
					until = c.Until
				}})
			if err != nil {
				t.Fatal(err)
			}
			h := mw(func(*message.Message) ([]*message.Message, error) { t.Fatal("ran"); return nil, nil })
			before := serverNow(t, rdb)
			if _, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
				t.Fatal(err)
			}
			after := serverNow(t, rdb)
			zs := rdb.ZRangeWithScores(ctx, delayq.Key(stream), 0, -1).Val()
			if len(zs) != 1 {
				t.Fatalf("delayed set %v, want one member", zs)
			}
			due := time.UnixMilli(int64(zs[0].Score))
			if !due.Equal(until.Truncate(time.Millisecond)) {
				t.Errorf("the set says due %s, the record %s", due, until)
			}
			// D plus up to 20 % jitter, by the server's clock, to the millisecond.
			lo, hi := before.Truncate(time.Millisecond).Add(d), after.Add(d+d/5+time.Millisecond)
			if due.Before(lo) || due.After(hi) {
				t.Errorf("due %s after the conflict by the server's clock, want within [%s, %s]", due.Sub(before), d, d+d/5)
			}
			if n, _, err := delayq.Promote(ctx, rdb, stream); err != nil || n != 0 {
				t.Errorf("promoted %d at once (%v), want none before D", n, err)
			}
		})
	}
}
