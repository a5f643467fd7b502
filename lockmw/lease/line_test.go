package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// waitOpts are the wait policy's options for the event lid, read as entry id of stream
// (id == lid for the event itself, another id for its copy).
func waitOpts(stream, id, lid string, maxN int64) lease.AcquireOptions {
	return lease.AcquireOptions{MessageID: id, Wait: &lease.WaitOptions{
		Event:  lease.QueuedEvent{Stream: stream, Fields: map[string]any{"lid": lid}},
		LineID: lid, Max: maxN, Ack: &lease.Entry{Stream: stream, Group: "g", ID: id}}}
}

// lineWorld is a stream with group g and a locker on it.
type lineWorld struct {
	t      *testing.T
	ctx    context.Context
	rdb    *redis.Client
	l      *lease.Locker
	stream string
}

func newLineWorld(t *testing.T, format lease.KeyFormat) *lineWorld {
	t.Helper()
	rdb, ns := redistest.Client(t)
	w := &lineWorld{t: t, ctx: context.Background(), rdb: rdb, stream: ns + "rebase"}
	w.l = newLocker(t, rdb, ns, lease.Options{Format: format, TTL: 2 * time.Second})
	if err := rdb.XGroupCreateMkStream(w.ctx, w.stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return w
}

// add appends and reads n events, returning their ids.
func (w *lineWorld) add(n int) []string {
	var ids []string
	for i := range n {
		id, err := w.rdb.XAdd(w.ctx, &redis.XAddArgs{Stream: w.stream, Values: map[string]any{"n": i}}).Result()
		if err != nil {
			w.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	w.read()
	return ids
}

// read reads every new entry of the stream into the group; it returns them.
func (w *lineWorld) read() []redis.XMessage {
	res, err := w.rdb.XReadGroup(w.ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{w.stream, ">"}, Block: -1}).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return res[0].Messages
}

func (w *lineWorld) acquire(id, lid string) (*lease.Lease, error) {
	return w.l.Acquire(w.ctx, "rebase", "RHEL-1", waitOpts(w.stream, id, lid, 3))
}

// finish ends le's run as the middleware does (Handoff: release, hand over, ack).
func (w *lineWorld) finish(le *lease.Lease, id string) {
	if _, err := le.Handoff(w.ctx, lease.Entry{Stream: w.stream, Group: "g", ID: id}, nil); err != nil {
		w.t.Fatal(err)
	}
}

// copyOf reads the copy the line appended for lid: exactly one new entry.
func (w *lineWorld) copyOf(lid string) string {
	w.t.Helper()
	msgs := w.read()
	if len(msgs) != 1 || msgs[0].Values["lid"] != lid {
		w.t.Fatalf("want one copy of %s appended, got %v", lid, msgs)
	}
	return msgs[0].ID
}

// Issue 37 item 1: events that find the key busy wait in line (acked in the script that
// finds it busy), a repeat waits once, the line is bounded, and each release hands the
// key to the head (its copy appended) and to nobody else; a copy of an event that ran is
// acked and not run again. On both key formats (Cluster: the copy is appended by the
// caller, once, between two calls of the release script).
func TestWaitLineHandsOverInOrder(t *testing.T) {
	for _, f := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		t.Run(fmt.Sprint(f), func(t *testing.T) {
			t.Parallel()
			w := newLineWorld(t, f)
			ids := w.add(5)
			first := w.fillLine(f, ids)
			w.lineIsShown(ids)
			curID := w.handOverInOrder(f, first, ids)
			// A redelivered copy of an event that ran: acked, not run.
			_, err := w.acquire(curID, ids[4])
			var le *lease.LockedError
			if !errors.As(err, &le) || !le.Ran {
				t.Fatalf("copy of a finished event: %v", err)
			}
			if n, _ := w.rdb.XPending(w.ctx, w.stream, "g").Result(); n.Count != 0 {
				t.Fatalf("pending: %+v (want every entry acked)", n)
			}
		})
	}
}

// fillLine takes the key for ids[0] and lines up ids[1:4] behind it (acked by the
// caller, after its record); a repeat joins once and ids[4] finds the line full. It
// returns the run of ids[0].
func (w *lineWorld) fillLine(f lease.KeyFormat, ids []string) *lease.Lease {
	t := w.t
	t.Helper()
	first, err := w.acquire(ids[0], ids[0])
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids[1:4] {
		_, err := w.acquire(id, id)
		var le *lease.LockedError
		if !errors.As(err, &le) || !le.Waited || le.Position != int64(i+1) || le.OldestAt.IsZero() {
			t.Fatalf("event %d: %#v", i+1, err)
		}
		w.rdb.XAck(w.ctx, w.stream, "g", id)
	}
	// A repeat joins once; a fourth waiting event is refused.
	_, err = w.acquire(ids[1], ids[1])
	if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Duplicate {
		t.Fatalf("repeat: %v", err)
	}
	var full *lease.LineFullError
	if _, err := w.acquire(ids[4], ids[4]); !errors.As(err, &full) || full.Waiting != 3 {
		t.Fatalf("full line: %v", err)
	}
	return first
}

// lineIsShown checks that Inspect, List and Lines show the line of three, ids[1] first.
func (w *lineWorld) lineIsShown(ids []string) {
	t := w.t
	t.Helper()
	if info, ok, err := w.l.Inspect(w.ctx, "rebase", "RHEL-1"); err != nil || !ok || info.Waiting != 3 || info.OldestWaiting.IsZero() {
		t.Fatalf("inspect shows the line: %+v %v %v", info, ok, err)
	}
	if all, err := w.l.List(w.ctx, "rebase"); err != nil || len(all) != 1 || all[0].Waiting != 3 {
		t.Fatalf("list shows the line: %+v %v", all, err)
	}
	lines, err := w.l.Lines(w.ctx, "rebase", "RHEL-1")
	if err != nil || len(lines) != 3 || lines[0].LineID != ids[1] {
		t.Fatalf("line: %v %v", lines, err)
	}
}

// handOverInOrder ends first's run and then each copy's: every release hands the key to
// the head of the line (its copy appended), which runs; ids[4] joins the tail meanwhile.
// The last release wakes nobody. It returns the entry id of the last copy that ran.
func (w *lineWorld) handOverInOrder(f lease.KeyFormat, first *lease.Lease, ids []string) string {
	t := w.t
	t.Helper()
	var err error
	cur, curID := first, ids[0]
	for i, lid := range ids[1:5] {
		w.finish(cur, curID)
		cp := w.copyOf(lid)
		if i == 0 {
			// The key handed to the head is not taken by another event meanwhile:
			// that one joins the tail (the line has room again).
			_, err := w.acquire(ids[4], ids[4])
			if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Waited || le.Position != 3 {
				t.Fatalf("the key handed to %s: another event got %v", lid, err)
			}
			w.rdb.XAck(w.ctx, w.stream, "g", ids[4]) // the caller's ack
		}
		if cur, err = w.acquire(cp, lid); err != nil {
			t.Fatalf("copy of %s: %v", lid, err)
		}
		curID = cp
	}
	w.finish(cur, curID)
	if msgs := w.read(); len(msgs) != 0 {
		t.Fatalf("a release woke somebody with an empty line: %v", msgs)
	}
	return curID
}

// A run that does not finish (its worker crashed: the lease expires) keeps its turn:
// an event arriving meanwhile waits, the redelivery takes the key, and its end hands it
// on. A lost wake-up (the turn expired with events waiting) is reported and woken.
func TestWaitTurnSurvivesCrash(t *testing.T) {
	t.Parallel()
	w := newLineWorld(t, lease.KeysCompat)
	w.l = newLocker(t, w.rdb, w.stream[:len(w.stream)-len("rebase")], lease.Options{TTL: 100 * time.Millisecond})
	ids := w.add(3)
	opts := func(id string) lease.AcquireOptions {
		o := waitOpts(w.stream, id, id, 10)
		o.Wait.Hold = 400 * time.Millisecond
		return o
	}
	crashed, err := w.l.Acquire(w.ctx, "rebase", "RHEL-1", opts(ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	crashed.Abandon() // a SIGKILL: no release, no heartbeat
	keys := w.l.Keys("rebase", "RHEL-1")
	for w.rdb.Exists(w.ctx, keys.Lock).Val() == 1 {
		time.Sleep(10 * time.Millisecond)
	}
	_, err = w.l.Acquire(w.ctx, "rebase", "RHEL-1", opts(ids[1]))
	if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Waited || le.Stranded {
		t.Fatalf("an event arriving during the crashed run's turn must wait: %v", err)
	}
	again, err := w.l.Acquire(w.ctx, "rebase", "RHEL-1", opts(ids[0]))
	if err != nil {
		t.Fatalf("the redelivery must take its turn: %v", err)
	}
	again.Abandon()
	// Its turn expires: the line is stranded, the next arrival says so, WakeLine wakes it.
	for w.rdb.Exists(w.ctx, keys.Line().Turn).Val() == 1 {
		time.Sleep(10 * time.Millisecond)
	}
	_, err = w.l.Acquire(w.ctx, "rebase", "RHEL-1", opts(ids[2]))
	if le := (*lease.LockedError)(nil); !errors.As(err, &le) || !le.Waited || !le.Stranded || le.Position != 2 {
		t.Fatalf("stranded line: %v", err)
	}
	sw, err := w.l.WakeLines(w.ctx, "rebase", 400*time.Millisecond)
	if err != nil || len(sw.Woken) != 1 || sw.Woken[0] != ids[1] || sw.Lines != 1 || sw.Waiting != 1 || sw.Longest != 1 {
		t.Fatalf("wake: %+v %v", sw, err)
	}
	if lid, _ := w.l.WakeLine(w.ctx, "rebase", "RHEL-1", 0, 0); lid != "" {
		t.Fatalf("a second wake woke %s", lid)
	}
	w.copyOf(ids[1])
}

// A stale copy of an event (its entry no longer pending: another copy of the same entry,
// a second claim's, joined the line and acked it; then the failed run's message was
// handed over again by its reader) does not take the key the line hands to its event.
// The line's own copy takes it, so that a crash of that run leaves a pending entry to
// bring the event back (make explore, line model seed 20794584). On both key formats:
// on Cluster the script cannot see the source stream, so the line remembers the
// entries it took (acked, or told its caller to ack).
func TestWaitStaleCopyLeavesTheTurnToTheLinesCopy(t *testing.T) {
	for _, f := range []lease.KeyFormat{lease.KeysCompat, lease.KeysCluster} {
		t.Run(fmt.Sprint(f), func(t *testing.T) {
			t.Parallel()
			staleCopyLeavesTheTurn(t, f)
		})
	}
}

func staleCopyLeavesTheTurn(t *testing.T, f lease.KeyFormat) {
	w := newLineWorld(t, f)
	ids := w.add(2)
	first, err := w.acquire(ids[0], ids[0])
	if err != nil {
		t.Fatal(err)
	}
	var le *lease.LockedError
	if _, err := w.acquire(ids[1], ids[1]); !errors.As(err, &le) || !le.Waited {
		t.Fatalf("the second event must join the line, its entry left to the caller to ack: %v", err)
	}
	w.rdb.XAck(w.ctx, w.stream, "g", ids[1]) // the caller's ack, after its record
	// The end of the first run hands the key to ids[1] and appends its copy.
	w.finish(first, ids[0])
	cp := w.copyOf(ids[1])
	if _, err := w.acquire(ids[1], ids[1]); !errors.As(err, &le) || !le.Duplicate {
		t.Fatalf("a stale copy (entry %s acked) must be refused as a copy: %v", ids[1], err)
	}
	run, err := w.acquire(cp, ids[1])
	if err != nil {
		t.Fatalf("the line's copy must take the key handed to its event: %v", err)
	}
	defer run.Abandon()
	p, err := w.rdb.XPendingExt(w.ctx, &redis.XPendingExtArgs{Stream: w.stream, Group: "g", Start: cp, End: cp, Count: 1}).Result()
	if err != nil || len(p) != 1 {
		t.Fatalf("the running copy's entry must stay pending (a crash is claimed back): %v %v", p, err)
	}
}
