package lease_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// deliverOpts are the deliver policy's options for the follow-up event id (an entry of
// stream in group).
func deliverOpts(stream, id string, depth int64, body string) lease.AcquireOptions {
	return lease.AcquireOptions{MessageID: id, Drain: true, Deliver: &lease.DeliverOptions{
		Followup: map[string]any{"event_type": "comment_created", "message_id": id, "body": body},
		Event:    lease.QueuedEvent{Stream: stream, Fields: map[string]any{"payload": body}},
		MaxDepth: depth,
	}}
}

// Issue 24 item 1: an event that meets a held lease under the deliver policy is
// appended to the holder's mailbox in one script (its caller acks the entry, after its
// record); a repeat (lost reply)
// appends nothing; the mailbox is bounded; the run reads it; the release starts a next
// run only for follow-ups the run did not account for.
func TestDeliverMailbox(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	stream := ns + "triage"
	if err := rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	holder, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "1-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := readThreeEntries(t, ctx, rdb, stream)
	first := deliverTwoRefuseThird(t, ctx, rdb, l, holder, stream, ids)
	fu := readMailboxReleaseRest(t, ctx, rdb, l, holder, stream, first)
	run2 := secondRunAccountsForAll(t, ctx, l, holder, stream, ids, fu)
	keys := l.Keys("triage", "RHEL-1")
	if exists(t, rdb, keys.Queue) || exists(t, rdb, keys.Mailbox) {
		t.Error("the queued event or the empty mailbox outlived the lease")
	}
	// A run that lost its lease removes nothing.
	if _, err := run2.MailboxDone(ctx, "1-0"); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("done after release: %v", err)
	}
}

// readThreeEntries adds three entries to stream and reads them into group g (pending).
func readThreeEntries(t *testing.T, ctx context.Context, rdb *redis.Client, stream string) []string {
	t.Helper()
	var ids []string
	for i := range 3 {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": i}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// deliverTwoRefuseThird delivers the first two entries to holder's mailbox (depth 2),
// repeats the first (nothing appended) and finds the mailbox full for the third (not
// acked, by the script or its caller). It returns the first follow-up's mailbox id.
func deliverTwoRefuseThird(t *testing.T, ctx context.Context, rdb *redis.Client, l *lease.Locker, holder *lease.Lease, stream string, ids []string) string {
	t.Helper()
	var first string
	for i, id := range ids[:2] {
		_, err := l.Acquire(ctx, "triage", "RHEL-1", deliverOpts(stream, id, 2, "body "+strconv.Itoa(i)))
		var le *lease.LockedError
		if !errors.As(err, &le) || !le.Delivered || le.Duplicate || le.MailboxID == "" || le.Depth != int64(i+1) {
			t.Fatalf("follow-up %d: %#v", i, err)
		}
		rdb.XAck(ctx, stream, "g", id) // the caller's ack, after its record
		if i == 0 {
			first = le.MailboxID
		}
	}
	// A repeat of the first (its reply lost) appends nothing.
	_, err := l.Acquire(ctx, "triage", "RHEL-1", deliverOpts(stream, ids[0], 2, "body 0"))
	if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Duplicate || le.MailboxID != "" {
		t.Fatalf("repeat: %v", err)
	}
	// The third finds the mailbox full: refused, not acked.
	_, err = l.Acquire(ctx, "triage", "RHEL-1", deliverOpts(stream, ids[2], 2, "body 2"))
	var full *lease.MailboxFullError
	if !errors.As(err, &full) || full.Depth != 2 || full.Holder.Fence != holder.Fence() {
		t.Fatalf("full mailbox: %v", err)
	}
	pend, _ := rdb.XPending(ctx, stream, "g").Result()
	if pend.Count != 1 || pend.Lower != ids[2] {
		t.Fatalf("pending %+v: want only the refused %s", pend, ids[2])
	}
	return first
}

// readMailboxReleaseRest reads holder's mailbox (two follow-ups, the first first), accounts
// for the first only and releases: the release publishes one next run, for the second.
func readMailboxReleaseRest(t *testing.T, ctx context.Context, rdb *redis.Client, l *lease.Locker, holder *lease.Lease, stream, first string) []lease.Followup {
	t.Helper()
	if n, _ := l.MailboxDepth(ctx, "triage", "RHEL-1"); n != 2 {
		t.Fatalf("depth %d", n)
	}
	fu, err := holder.Mailbox(ctx, "", 0)
	if err != nil || len(fu) != 2 || fu[0].ID != first || fu[0].Fields["body"] != "body 0" || fu[1].Fields["body"] != "body 1" {
		t.Fatalf("mailbox %+v %v", fu, err)
	}
	if rest, _ := holder.Mailbox(ctx, fu[0].ID, 0); len(rest) != 1 || rest[0].ID != fu[1].ID {
		t.Fatalf("after %s: %+v", fu[0].ID, rest)
	}
	// The run accounts for the first only; its release publishes the queued event
	// (the newest follow-up's) once, for the second.
	if n, err := holder.MailboxDone(ctx, fu[0].ID); n != 1 || err != nil {
		t.Fatalf("done: %d %v", n, err)
	}
	if _, err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if holder.Requeued() == "" {
		t.Fatal("a follow-up is left and no next run was published")
	}
	next, _ := rdb.XRange(ctx, stream, holder.Requeued(), holder.Requeued()).Result()
	if len(next) != 1 || next[0].Values["payload"] != "body 1" {
		t.Fatalf("next run %+v", next)
	}
	for k := range next[0].Values {
		if k[0] == '_' {
			t.Errorf("next run carries the queue's own field %s", k)
		}
	}
	return fu
}

// secondRunAccountsForAll runs the published next run: it accounts for the rest and for
// one more follow-up delivered to it, so its release starts nothing. It returns the
// released run.
func secondRunAccountsForAll(t *testing.T, ctx context.Context, l *lease.Locker, holder *lease.Lease, stream string, ids []string, fu []lease.Followup) *lease.Lease {
	t.Helper()
	// The next run accounts for the rest: its release starts nothing.
	run2, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: holder.Requeued(), Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run2.MailboxDone(ctx, fu[1].ID); err != nil {
		t.Fatal(err)
	}
	// Another follow-up, accounted for at once: still nothing to start.
	_, err = l.Acquire(ctx, "triage", "RHEL-1", deliverOpts(stream, ids[2], 2, "body 2"))
	if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Delivered {
		t.Fatalf("follow-up to run 2: %v", err)
	}
	fu2, _ := run2.Mailbox(ctx, "", 0)
	if len(fu2) != 1 {
		t.Fatalf("run 2's mailbox %+v", fu2)
	}
	if _, err := run2.MailboxDone(ctx, fu2[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := run2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if run2.Requeued() != "" {
		t.Fatalf("every follow-up was accounted for, yet %s was published", run2.Requeued())
	}
	return run2
}

// Issue 24 item 4: a burst of 10 000 follow-ups for one issue while its lease is held
// stays bounded in Redis by DeliverOptions.MaxDepth: that many are appended, every
// other one is refused (the caller dead-letters it), and the mailbox, its seen set and
// the queued event hold no more.
func TestDeliverBurstIsBounded(t *testing.T) {
	t.Parallel() // own namespace, nothing timed
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	holder, err := l.Acquire(ctx, "triage", "RHEL-9", lease.AcquireOptions{MessageID: "1-1", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	const burst, depth, workers = 10_000, 50, 8
	body := strings.Repeat("x", 512)
	var delivered, full atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < burst; i += workers {
				id := strconv.Itoa(1000+i) + "-0"
				o := deliverOpts(ns+"triage", id, depth, body)
				_, err := l.Acquire(ctx, "triage", "RHEL-9", o)
				var le *lease.LockedError
				switch {
				case errors.As(err, &le) && le.Delivered:
					delivered.Add(1)
				case errors.Is(err, lease.ErrMailboxFull):
					full.Add(1)
				default:
					t.Errorf("follow-up %s: %v", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if delivered.Load() != depth || full.Load() != burst-depth {
		t.Fatalf("%d delivered, %d refused: want %d and %d", delivered.Load(), full.Load(), depth, burst-depth)
	}
	keys := l.Keys("triage", "RHEL-9")
	if n := rdb.XLen(ctx, keys.Mailbox).Val(); n != depth {
		t.Fatalf("mailbox holds %d", n)
	}
	if n := rdb.SCard(ctx, keys.Mailbox+":seen").Val(); n != depth {
		t.Fatalf("seen set holds %d", n)
	}
	// Bytes in Redis: the mailbox, its seen set and the one queued event, whatever the
	// burst's size.
	var total int64
	for _, k := range []string{keys.Mailbox, keys.Mailbox + ":seen", keys.Queue} {
		total += rdb.MemoryUsage(ctx, k).Val()
	}
	if limit := int64(depth * (len(body) + 400)); total > limit {
		t.Fatalf("the mailbox's keys use %d bytes after a %d burst, want under %d", total, burst, limit)
	}
	t.Logf("%d follow-ups: %d delivered, %d refused; %d bytes in Redis", burst, depth, burst-depth, total)
}

// Two follow-ups that entered an agent's stream and its :todo twin with one entry id are
// two follow-ups: both are appended to the holder's mailbox. The seen set named a
// follow-up by its entry id alone, took the second for a repeat of the first (a lost
// reply), and its caller acked it: delivered to nobody.
func TestDeliverTellsApartTwoStreamsEntriesOfOneID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, ns := redistest.Client(t)
	l := newLocker(t, rdb, ns, lease.Options{})
	if _, err := l.Acquire(ctx, "triage", "RHEL-1", lease.AcquireOptions{MessageID: "1-1", Drain: true}); err != nil {
		t.Fatal(err)
	}
	for i, stream := range []string{ns + "triage", ns + "triage:todo"} {
		_, err := l.Acquire(ctx, "triage", "RHEL-1", deliverOpts(stream, "5-1", 10, "body "+strconv.Itoa(i)))
		var le *lease.LockedError
		if !errors.As(err, &le) || !le.Delivered || le.Duplicate || le.Depth != int64(i+1) {
			t.Fatalf("5-1 of %s: %v, want it delivered, %d in the mailbox", stream, err, i+1)
		}
	}
}
