package lockmw_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

func TestParseLimits(t *testing.T) {
	l, err := lockmw.ParseLimits("rebase=4, field:metadata.component=1,field:m:team=2,fair:metadata.component,weight:kernel=3")
	if err != nil {
		t.Fatal(err)
	}
	if l.Agents["rebase"] != 4 || len(l.Fields) != 2 || l.Fields[0] != (lockmw.FieldLimit{Path: "metadata.component", N: 1}) ||
		l.Fields[1] != (lockmw.FieldLimit{Path: "m:team", N: 2}) || l.FairField != "metadata.component" || l.Weights["KERNEL"] != 3 {
		t.Fatalf("parsed %+v", l)
	}
	if l, err := lockmw.ParseLimits(""); err != nil || !l.Empty() {
		t.Fatalf("empty: %+v, %v", l, err)
	}
	for _, bad := range []string{"rebase=0", "rebase", "rebase=x", "field:=1", "field:a+b=1", "rebase=1,rebase=2",
		"weight:kernel=3", "fair:", "fair:a,fair:b", "weight:kernel=0,fair:c", "re:base=1"} {
		if _, err := lockmw.ParseLimits(bad); err == nil || !strings.Contains(err.Error(), "want") && !strings.Contains(err.Error(), "bad") &&
			!strings.Contains(err.Error(), "twice") && !strings.Contains(err.Error(), "needs") && !strings.Contains(err.Error(), "one fair") {
			t.Errorf("%q: %v, want an error", bad, err)
		}
	}
}

// On standalone Redis the middleware takes a run's slots with its lease, in one script:
// under rebase=1, while one run holds the agent's slot its token holds both its issue's
// lease and the slot; a second issue's event finds the slot full and waits, acked, with
// no lease taken; the first run's end frees the slot with its lease and hands it on
// (the waiter's copy appended), with nothing else in between.
func TestLimitSlotsTakenWithTheLease(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	ctx := context.Background()
	stream := ns + "s"
	id1 := pendingEntry(t, rdb, stream, "c")
	id2 := pendingEntry(t, rdb, stream, "c")
	limits, err := lockmw.ParseLimits("rebase=1")
	if err != nil {
		t.Fatal(err)
	}
	handler := func(id string) message.HandlerFunc {
		src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
		mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour, Limits: limits})
		if err != nil {
			t.Fatal(err)
		}
		return mw(func(msg *message.Message) ([]*message.Message, error) {
			if id != id1 {
				t.Errorf("%s ran while the slot was held", id)
				return nil, nil
			}
			token := rdb.Get(ctx, l.Keys("rebase", "RHEL-1").Lock).Val()
			holders := rdb.ZRange(ctx, l.SlotKeys("agent:rebase").Holders, 0, -1).Val()
			if token == "" || len(holders) != 1 || holders[0] != token {
				t.Errorf("during the run: lease token %q, slot holders %v: want the lease's token alone", token, holders)
			}
			second := handlerFor(t, stream, id2, l, limits)
			if _, err := second(message.NewMessage("u2", []byte(`{"metadata":{"issue":"RHEL-2"}}`))); err != nil {
				t.Errorf("the second event: %v", err)
			}
			if exists(t, rdb, l.Keys("rebase", "RHEL-2").Lock) {
				t.Error("an event that waits for a slot holds its issue's lease")
			}
			if u, _ := l.SlotUsage(ctx, "agent:rebase"); u.Used != 1 || u.Waiting != 1 {
				t.Errorf("usage %+v, want 1 used, 1 waiting", u)
			}
			if p := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id2, End: id2, Count: 1}).Val(); len(p) != 0 {
				t.Errorf("the waiting event's entry is still pending: %v", p)
			}
			return nil, nil
		})
	}
	if _, err := handler(id1)(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
		t.Fatal(err)
	}
	holders := rdb.ZRange(ctx, l.SlotKeys("agent:rebase").Holders, 0, -1).Val()
	if exists(t, rdb, l.Keys("rebase", "RHEL-1").Lock) || len(holders) != 1 || holders[0] != "w:"+id2+" "+stream {
		t.Fatalf("after the run: slot holders %v, want the slot handed to %s", holders, id2)
	}
	copies := rdb.XRange(ctx, stream, "("+id2, "+").Val()
	if len(copies) != 1 {
		t.Fatalf("copies appended: %v, want the waiter's one", copies)
	}
}

// handlerFor is the limited middleware over entry id, whose handler must not run.
func handlerFor(t *testing.T, stream, id string, l *lease.Locker, limits lockmw.Limits) message.HandlerFunc {
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	return mw(func(*message.Message) ([]*message.Message, error) {
		t.Errorf("%s ran while the slot was held", id)
		return nil, nil
	})
}
