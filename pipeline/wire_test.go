package pipeline_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw"
)

// The event format names, without importing it, what watermill-redisstream names: the
// uuid field a stock Watermill publisher writes. (The lock middleware uses the event
// format's own names for the metadata it reads and writes.)
func TestWireNamesAgreeWithLockmwAndWatermill(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ event, other string }{
		{event.FieldUUID, redisstream.UUIDHeaderKey},
	} {
		if c.event != c.other {
			t.Errorf("event says %q, the other side %q", c.event, c.other)
		}
	}
}

// A handler's publishes through event.Publisher are fenced by the lease the lock
// middleware gives it (event.FencerFrom finds it in the handler's context): the entry
// carries the lease's fence, and once the lease is gone the publish is refused and
// nothing is written.
func TestPublishUnderTheRoutersLeaseIsFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := e.topo.Stream("rebase", "c9s", false)
	var fence int64
	refused := make(chan error, 1)
	e.start(ctx, routerOpts{}, func(msg *message.Message) error {
		lease, ok := lockmw.LeaseFrom(msg.Context())
		if !ok {
			return errors.New("no lease")
		}
		fence = lease.Fence()
		next, err := event.New(event.RebaseRequested, issueOf(msg), event.Task{}, msg)
		if err != nil {
			return err
		}
		if _, err := e.pub.PublishID(msg.Context(), out, next); err != nil {
			return err
		}
		if _, err := lease.Release(context.Background()); err != nil {
			return err
		}
		late, _ := event.New(event.RebaseRequested, issueOf(msg), event.Task{}, msg)
		_, err = e.pub.PublishID(msg.Context(), out, late)
		refused <- err
		return nil
	})
	e.publishTriage("RHEL-7")
	var err error
	select {
	case err = <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not run")
	}
	if err == nil {
		t.Fatal("a publish after the lease was released went through")
	}
	entries := e.rdb.XRange(ctx, out, "-", "+").Val()
	if len(entries) != 1 || entries[0].Values[event.MetaPrefix+event.MetaFence] != strconv.FormatInt(fence, 10) || fence == 0 {
		t.Fatalf("entries %v, want one with fence %d", entries, fence)
	}
}
