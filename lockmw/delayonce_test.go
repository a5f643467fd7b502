package lockmw_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// An entry delayed twice (a second consumer claimed it while the first was still on
// it, say) keeps the delay it was recorded with: the first delayed_until stands, so
// the copy never comes back before the time its record gives (the integration suite
// saw it 21 ms early under load when the second delay's jitter was smaller).
func TestEntryDelayedTwiceKeepsItsFirstTime(t *testing.T) {
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
	var mu sync.Mutex
	var untils []time.Time
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
		Policies: lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Delay, Delay: time.Second, MaxDelay: 8 * time.Second}},
		OnConflict: func(_ context.Context, _ redis.Pipeliner, c lockmw.Conflict) {
			mu.Lock()
			untils = append(untils, c.Until)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(func(*message.Message) ([]*message.Message, error) { t.Fatal("ran"); return nil, nil })
	for range 3 {
		if _, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // the second consumer comes a little later
	}
	zs := rdb.ZRangeWithScores(ctx, delayq.Key(stream), 0, -1).Val()
	if len(zs) != 1 || len(untils) != 3 {
		t.Fatalf("delayed set %v after %d delays, want one member", zs, len(untils))
	}
	if got, want := int64(zs[0].Score), untils[0].UnixMilli(); got != want {
		t.Errorf("the delayed copy is due at %d, its first delay said %d (the later ones %v)", got, want, untils[1:])
	}
}
