package lockmw_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// metaSource is streamSource whose entries carry the message's metadata ("m:<name>"
// fields, as the pipeline's marshaller writes them), and whose entry is settable.
type metaSource struct{ streamSource }

func (s *metaSource) Encode(m *message.Message) (map[string]any, error) {
	f := map[string]any{"payload": string(m.Payload)}
	for k, v := range m.Metadata {
		f["m:"+k] = v
	}
	return f, nil
}

// messageOf is the message of a stream entry written by metaSource.Encode.
func messageOf(t *testing.T, rdb *redis.Client, stream, id string) *message.Message {
	t.Helper()
	xs := rdb.XRange(context.Background(), stream, id, id).Val()
	if len(xs) != 1 {
		t.Fatalf("entry %s of %s: %v", id, stream, xs)
	}
	msg := message.NewMessage("u-"+id, []byte(xs[0].Values["payload"].(string)))
	for k, v := range xs[0].Values {
		if name, ok := strings.CutPrefix(k, "m:"); ok {
			msg.Metadata.Set(name, v.(string))
		}
	}
	return msg
}

// The event a release republishes for its mailbox's follow-ups (they were left
// unaccounted for) stands for those follow-ups, not for a new one: when it meets a run
// that took the lease meanwhile and has already read them, it is not appended to the
// mailbox again (the agent would be told the same comment twice), only kept as the
// issue's queued event, so that this run's release starts a next run only if
// follow-ups remain.
func TestRepublishedFollowupIsNotDeliveredTwice(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := locker(t, rdb, ns)
	stream := ns + "s"
	holder, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Owner: "holder", MessageID: "1-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	src := &metaSource{}
	var last lockmw.Conflict
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
		Policy: lockmw.Deliver, OnConflict: func(_ context.Context, _ redis.Pipeliner, c lockmw.Conflict) { last = c }})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(func(*message.Message) ([]*message.Message, error) { t.Error("ran"); return nil, nil })
	handle := func(id string, msg *message.Message) {
		t.Helper()
		src.entry = lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}
	comment := message.NewMessage("c1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))
	comment.Metadata.Set(event.MetaCommentID, "10001")
	handle(pendingEntry(t, rdb, stream, "c"), comment)
	if _, err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	republished := holder.Requeued()
	if republished == "" {
		t.Fatal("the release republished nothing for the unaccounted follow-up")
	}
	// Another event's run takes the lease first and reads the follow-up.
	next, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Owner: "next", MessageID: "2-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	fu, err := next.Mailbox(ctx, "", 0)
	if err != nil || len(fu) != 1 {
		t.Fatalf("the next run's mailbox: %v, %v", fu, err)
	}
	if _, err := next.MailboxDone(ctx, fu[0].ID); err != nil {
		t.Fatal(err)
	}
	// Now the republished event is read, and meets that run.
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}})
	handle(republished, messageOf(t, rdb, stream, republished))
	if !last.Queued || last.Delivered {
		t.Errorf("the republished event meeting the run: %+v, want it queued (lock.coalesced), not delivered", last)
	}
	if again, _ := next.Mailbox(ctx, "", 0); len(again) != 0 {
		t.Errorf("the follow-up the run already read was delivered to it again: %v", again)
	}
	if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 0 {
		t.Errorf("%d entries pending, want the republished one acked", n)
	}
	if _, err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if again := next.Requeued(); again != "" {
		t.Errorf("the run accounted for every follow-up, yet its release started another run (%s)", again)
	}
	var locked *lease.LockedError
	if _, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{}); errors.As(err, &locked) {
		t.Errorf("the lease is still held: %v", err)
	}
}

// A republished event that meets a free lease after a run accounted for every
// follow-up it stood for does not run: it is acked, and nothing is left pending.
func TestRepublishedFollowupAccountedForDoesNotRun(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ctx := context.Background()
	l := locker(t, rdb, ns)
	stream := ns + "s"
	holder, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Owner: "holder", MessageID: "1-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	src := &metaSource{}
	var last lockmw.Conflict
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
		Policy: lockmw.Deliver, OnConflict: func(_ context.Context, _ redis.Pipeliner, c lockmw.Conflict) { last = c }})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	h := mw(func(*message.Message) ([]*message.Message, error) { ran++; return nil, nil })
	handle := func(id string, msg *message.Message) {
		t.Helper()
		src.entry = lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
	}
	handle(pendingEntry(t, rdb, stream, "c"), message.NewMessage("r1", []byte(`{"metadata":{"issue":"RHEL-1"}}`)))
	if _, err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	republished := holder.Requeued()
	next, err := l.Acquire(ctx, "rebase", "RHEL-1", lease.AcquireOptions{Owner: "next", MessageID: "2-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	fu, _ := next.Mailbox(ctx, "", 0)
	if len(fu) != 1 {
		t.Fatalf("the next run's mailbox: %v", fu)
	}
	if _, err := next.MailboxDone(ctx, fu[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}})
	handle(republished, messageOf(t, rdb, stream, republished))
	if ran != 0 {
		t.Errorf("the republished event ran %d times though its follow-up was accounted for", ran)
	}
	if last.Queued || last.Delivered || last.Holder.MessageID != "2-1" {
		t.Errorf("the republished event: %+v, want dropped naming the run that accounted for it (2-1)", last.Holder)
	}
	if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 0 {
		t.Errorf("%d entries pending, want the republished one acked", n)
	}
}
