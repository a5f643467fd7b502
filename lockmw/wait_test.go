package lockmw_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The wait policy is refused where its line could be missed: beside coalesce, deliver
// or supersede, with a shared scope, and without a stream to put the copies into; each
// refusal names the setting.
func TestNewMiddlewareRefusesWaitWhereALineCouldBeMissed(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	src := &streamSource{}
	for _, c := range []struct {
		policies, scope string
		source          bool
		want            string
	}{
		{"rebase.requested=wait,*=coalesce", "agent", true, "wait can be combined with drop and delay only"},
		{"rebase.requested=wait,*=supersede", "agent", true, "wait can be combined with drop and delay only"},
		{"wait", "issue,group:m:lock_key", true, "cannot be combined with Config.Scopes"},
		{"wait", "agent", false, "policy wait needs Config.Source"},
	} {
		pol, err := lockmw.ParsePolicies(c.policies)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := lease.ParseScopes(c.scope)
		if err != nil {
			t.Fatal(err)
		}
		cfg := lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Scopes: sc, MaxIdleTime: time.Hour}
		if c.source {
			cfg.Source = src
		}
		if _, err := lockmw.NewMiddleware(cfg); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("%s with scope %s: %v, want %q", c.policies, c.scope, err, c.want)
		}
	}
	pol, _ := lockmw.ParsePolicies("rebase.requested=wait:3,*=delay:1s")
	if _, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Source: src, MaxIdleTime: time.Hour}); err != nil {
		t.Fatalf("wait beside delay: %v", err)
	}
	for _, scope := range []string{"issue", "group:m:lock_key"} {
		sc, _ := lease.ParseScopes(scope)
		if _, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Scopes: sc, Source: src, MaxIdleTime: time.Hour}); err != nil {
			t.Fatalf("wait with scope %s: %v", scope, err)
		}
	}
}

// lineObs is a lease.Observer that keeps the last lines RunLineWaker reported.
type lineObs struct {
	mu      sync.Mutex
	waiting int64
	seen    bool
}

func (*lineObs) Acquired(string)                 {}
func (*lineObs) Busy(string)                     {}
func (*lineObs) Conflict(string, string, string) {}
func (*lineObs) Lost(string, error)              {}
func (*lineObs) Released(string, time.Duration)  {}
func (o *lineObs) Lines(_ string, _ int, waiting, _ int64) {
	o.mu.Lock()
	o.waiting, o.seen = waiting, true
	o.mu.Unlock()
}

// The line waker reports the agent's lines to an observer that wants them (the
// metrics' ymirflow_lock_waiting).
func TestLineWakerReportsTheLines(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	obs := &lineObs{}
	l, err := lease.New(rdb, lease.Options{Scope: ns, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream := ns + "s"
	wait := func(id string) lease.AcquireOptions {
		return lease.AcquireOptions{MessageID: id, Wait: &lease.WaitOptions{LineID: id, Event: lease.QueuedEvent{Stream: stream}}}
	}
	holder, err := l.Acquire(ctx, "rebase", "RHEL-7", wait("1-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = holder.Release(ctx) }()
	if _, err := l.Acquire(ctx, "rebase", "RHEL-7", wait("2-1")); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("second event: %v", err)
	}
	pol, _ := lockmw.ParsePolicies("wait")
	m, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Source: &streamSource{}, MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.RunLineWaker(wctx, 10*time.Millisecond) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		obs.mu.Lock()
		seen, n := obs.seen, obs.waiting
		obs.mu.Unlock()
		if seen && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waker reported %v %d, want 1 waiting", seen, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A wait run that finished as its lease ended (a shutdown after its last write, the key
// still its own) ends as a finished run, not as a failed one: its turn ends with the
// record that it ran (finishWaiting), so a redelivered copy of its entry (its ack lost
// with the worker) is acked and not run again, and the line moves on to its head.
func TestWaitRunFinishedAsItsLeaseEndedIsNotRunAgain(t *testing.T) {
	t.Parallel()
	r := newWaitRig(t, nil) // the worker's SIGTERM, after the handler's last write
	ctx, rdb, l, stream, deliver := r.ctx, r.rdb, r.l, r.stream, r.deliver
	if err := deliver(); err != nil || r.runs != 1 {
		t.Fatalf("first delivery: err = %v, runs = %d", err, r.runs)
	}
	if n := rdb.XPending(ctx, stream, "g").Val().Count; n != 0 {
		t.Fatalf("%d entries pending, want the finished entry acked", n)
	}
	if got := rdb.XRange(ctx, stream, "-", "+").Val(); len(got) != 2 || got[1].Values["payload"] != "next" {
		t.Fatalf("stream %v: want the line's head appended (the key handed to it)", got)
	}
	// Its redelivery (the same entry again, as after an ack lost with the worker).
	if err := deliver(); err != nil || r.runs != 1 {
		t.Fatalf("redelivery: err = %v, runs = %d; want it acked as ran already, not run again", err, r.runs)
	}
	if w, err := l.Lines(ctx, "rebase", "RHEL-7"); err != nil || len(w) != 0 {
		t.Fatalf("line %v (%v): the redelivered copy joined it, to run a second time", w, err)
	}
}

// originSource is a streamSource that says which stream and group it reads.
type originSource struct {
	streamSource
	stream string
}

func (s *originSource) Origin() (string, string) { return s.stream, "g" }

// The line waker of a worker none of whose events has waited yet (freshly started after
// a kill) looks for the key's delivered events in the stream its Source reads: it does
// not hand a stranded line's key to its head past an earlier event of the key pending on
// a dead consumer (integration TestWaitLineRunsInOrderUnderKills once ran an event
// before an earlier one). Once that event has ended, the line moves on.
func TestFreshLineWakerDoesNotPassPendingEvent(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	obs := &lineObs{}
	l, err := lease.New(rdb, lease.Options{Scope: ns, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream := ns + "s"
	rdb.XGroupCreateMkStream(ctx, stream, "g", "0")
	rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1000-0", Values: map[string]any{event.MetaPrefix + event.MetaIssueKey: "RHEL-7", "payload": "{}"}})
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	wait := func(id string) lease.AcquireOptions {
		return lease.AcquireOptions{MessageID: id, Wait: &lease.WaitOptions{LineID: id, Event: lease.QueuedEvent{Stream: stream, Fields: map[string]any{"payload": id}}}}
	}
	if _, err := l.Acquire(ctx, "rebase", "RHEL-7", wait("500-0")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "rebase", "RHEL-7", wait("2000-0")); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("later event: %v, want it in line", err)
	}
	k := l.Keys("rebase", "RHEL-7")
	rdb.Del(ctx, k.Lock, k.Info, k.Line().Turn) // its holder crashed, its turn expired: stranded
	pol, _ := lockmw.ParsePolicies("wait")
	m, err := lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Policies: pol,
		Source: &originSource{stream: stream}, MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.RunLineWaker(wctx, 10*time.Millisecond) }()
	defer func() { stop(); <-done }()
	swept := func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		s := obs.seen
		obs.seen = false
		return s
	}
	waitUntil := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10 s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	swept()
	waitUntil("sweep", swept)
	waitUntil("second sweep", swept)
	if got := rdb.Get(ctx, k.Lock).Val(); got == "line:2000-0 "+stream {
		t.Fatal("the waker handed the key to 2000-0 while 1000-0, earlier, is pending on a dead consumer")
	}
	rdb.XAck(ctx, stream, "g", "1000-0") // it ended
	waitUntil("hand-over to the head once the earlier event ended", func() bool { return rdb.Get(ctx, k.Lock).Val() == "line:2000-0 "+stream })
}

// A wait run whose lease ended under it and whose handler failed for it (handlers: the
// agent's result discarded as the lease ended) keeps its event's turn: the entry's
// redelivery takes the key back under its own id (where the handler kept the agent's
// result) before the line moves on. Passing the turn on, as a failed run does, handed
// the key to the line's head and sent the event to the back of the line, to come back
// as a new copy that ran the agent again (integration TestWaitLineOnIssueKeyUnderKills).
func TestWaitRunWhoseLeaseEndedKeepsItsTurn(t *testing.T) {
	t.Parallel()
	r := newWaitRig(t, errors.New("runner result discarded: lease ended")) // the lease ends as the agent finishes
	ctx, rdb, stream, deliver := r.ctx, r.rdb, r.stream, r.deliver
	if err := deliver(); err == nil || r.runs != 1 {
		t.Fatalf("first delivery: err = %v, runs = %d; want it failed, left pending", err, r.runs)
	}
	if got := rdb.XLen(ctx, stream).Val(); got != 1 {
		t.Fatalf("%d stream entries: the key went to the line's head past the event whose lease ended", got)
	}
	if err := deliver(); err != nil || r.runs != 2 {
		t.Fatalf("redelivery: err = %v, runs = %d; want it run under its own entry (it joined the line instead)", err, r.runs)
	}
	if got := rdb.XRange(ctx, stream, "-", "+").Val(); len(got) != 2 || got[1].Values["payload"] != "next" {
		t.Fatalf("stream %v: want the line's head appended once the event ran", got)
	}
}

// Under a shared scope the line waker sweeps the shared keys' lines (the key an event
// waits on): it reports them, and hands a stranded one (its key free, nobody's turn)
// to its head, here an event of another issue under the same group key.
func TestLineWakerSweepsSharedLines(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	obs := &lineObs{}
	l, err := lease.New(rdb, lease.Options{Scope: ns, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream := ns + "s"
	sk := lease.ScopeKey{Scope: lease.ScopeGroup, Key: "OPENSSL"}
	wait := func(id string) lease.AcquireOptions {
		return lease.AcquireOptions{MessageID: id, Shared: []lease.ScopeKey{sk},
			Wait: &lease.WaitOptions{LineID: id, Event: lease.QueuedEvent{Stream: stream, Fields: map[string]any{"id": id}}}}
	}
	holder, err := l.Acquire(ctx, "rebase", "RHEL-7", wait("1-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = holder.Release(ctx) }()
	var locked *lease.LockedError
	if _, err := l.Acquire(ctx, "rebase", "RHEL-8", wait("2-1")); !errors.As(err, &locked) || !locked.Waited || locked.Line != sk {
		t.Fatalf("second event: %v, want it waiting in %v's line", err, sk)
	}
	// The holder's keys expire and its turn too (a run that never came back).
	keys, own := l.SharedKeys(sk), holder.Keys()
	rdb.Del(ctx, keys.Lock, keys.Info, keys.Line().Turn, own.Lock, own.Info)
	pol, _ := lockmw.ParsePolicies("wait")
	sc, _ := lease.ParseScopes("group:m:lock_key")
	m, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: "rebase", Policies: pol, Scopes: sc, Source: &streamSource{}, MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.RunLineWaker(wctx, 10*time.Millisecond) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, ok, _ := l.InspectShared(ctx, sk)
		if ok && in.Reserved && in.Issue == "RHEL-8" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waker did not hand the stranded group key to its head: %+v %v (info %v)", in, ok, rdb.HGetAll(ctx, keys.Info).Val())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, _ := rdb.XLen(ctx, stream).Result(); n != 1 {
		t.Fatalf("the head's copy: %d entries in its stream, want 1", n)
	}
}

// waitRig is a wait-policy middleware (agent rebase) over one entry of RHEL-7 pending for
// consumer c. The first run of its handler puts a second event of the issue in the line,
// then ends its delivery's context (the lease ends as the run finishes) and returns end;
// later runs return at once.
type waitRig struct {
	ctx      context.Context
	rdb      *redis.Client
	l        *lease.Locker
	stream   string
	h        message.NoPublishHandlerFunc
	runs     int
	shutdown context.CancelFunc
}

func newWaitRig(t *testing.T, end error) *waitRig {
	rdb, ns := redistest.Client(t)
	r := &waitRig{ctx: context.Background(), rdb: rdb, l: locker(t, rdb, ns), stream: ns + "s"}
	id := pendingEntry(t, rdb, r.stream, "c")
	src := &streamSource{entry: lockmw.Entry{Stream: r.stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	pol, _ := lockmw.ParsePolicies("wait")
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: r.l, Agent: "rebase", Policies: pol, Source: src, MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(func(msg *message.Message) ([]*message.Message, error) {
		r.runs++
		if r.runs > 1 {
			return nil, nil
		}
		if _, err := r.l.Acquire(r.ctx, "rebase", "RHEL-7", lease.AcquireOptions{MessageID: "9999999999999-0",
			Wait: &lease.WaitOptions{LineID: "9999999999999-0", Event: lease.QueuedEvent{Stream: r.stream, Fields: map[string]any{"payload": "next"}}}}); !errors.Is(err, lease.ErrLocked) {
			t.Errorf("second event: %v, want it in line", err)
		}
		r.shutdown()
		<-msg.Context().Done()
		return nil, end
	})
	r.h = func(msg *message.Message) error { _, err := h(msg); return err }
	return r
}

// deliver hands the entry's message to the middleware once, in a context of its own.
func (r *waitRig) deliver() error {
	runCtx, shutdown := context.WithCancel(r.ctx)
	defer shutdown()
	r.shutdown = shutdown
	msg := message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-7"}}`))
	msg.SetContext(runCtx)
	return r.h(msg)
}

// A stale copy of an event's first entry, refused by the line as a copy while the line
// reserves the key for that event, is recorded and acked like any copy: the reserved
// key names that entry as its holder, yet it is not the holder's in-flight entry. Here
// the event's joining reached Redis but its caller never learned it (the reply lost
// past go-redis's retries: neither recorded nor acked then), and its entry came back
// (make explore, lockmw seed 20880032 with a lagging replica: it was left pending
// unrecorded, then acked unrecorded as a copy of an event that ran).
func TestWaitStaleCopyOfTheReservedEventIsRecordedAndAcked(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	ctx := context.Background()
	stream := ns + "s"
	first, id := pendingEntry(t, rdb, stream, "c"), pendingEntry(t, rdb, stream, "c")
	wait := func(id string) lease.AcquireOptions {
		return lease.AcquireOptions{MessageID: id, Wait: &lease.WaitOptions{LineID: id,
			Event: lease.QueuedEvent{Stream: stream, Fields: map[string]any{"waited_from": id}}, Ack: &lease.Entry{Stream: stream, Group: "g", ID: id}}}
	}
	holder, err := l.Acquire(ctx, "rebase", "RHEL-7", wait(first))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "rebase", "RHEL-7", wait(id)); !errors.Is(err, lease.ErrLocked) {
		t.Fatalf("the event must join the line: %v", err)
	}
	// The holder's end hands the key to the event: reserved for it, its copy appended.
	if _, err := holder.Handoff(ctx, lease.Entry{Stream: stream, Group: "g", ID: first}, nil); err != nil {
		t.Fatal(err)
	}
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	pol, _ := lockmw.ParsePolicies("wait")
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Policies: pol, Source: src,
		OnConflict: recordTo(ns + "results"), MaxIdleTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	if _, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-7"}}`))); err != nil || ran {
		t.Fatalf("the stale copy: err = %v, ran = %v; want it settled as a copy, not run", err, ran)
	}
	recs, err := rdb.XRange(ctx, ns+"results", "-", "+").Result()
	if err != nil || len(recs) != 1 || recs[0].Values["message_id"] != id {
		t.Fatalf("records %v (%v), want one for the copy's entry %s", recs, err, id)
	}
	if p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id, End: id, Count: 1}).Result(); err != nil || len(p) != 0 {
		t.Fatalf("the copy's entry is still pending (%v %v): recorded and acked, it must not be", p, err)
	}
}

// A conflict whose script ran but whose reply was lost past go-redis's retries (the
// worker saw an error and its reader hands the message over again only while its entry
// is pending) leaves its entry pending: the redelivery, a repeat, writes the conflict's
// record and acks the entry, record first. Were the entry acked in the script that found
// the key busy, it would end acked and unrecorded (make explore, lockmw seed 20880032).
func TestConflictWhoseReplyIsLostIsRecordedOnItsRedelivery(t *testing.T) {
	for _, pol := range []string{"wait", "deliver"} {
		t.Run(pol, func(t *testing.T) {
			t.Parallel()
			direct, ns := redistest.Client(t)
			proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
			rdb := proxy.Client(direct.Options())
			ctx := context.Background()
			stream := ns + "s"
			id := pendingEntry(t, direct, stream, "c")
			holder, err := locker(t, direct, ns).Acquire(ctx, "rebase", "RHEL-7", lease.AcquireOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = holder.Release(ctx) })
			src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
			policies, _ := lockmw.ParsePolicies(pol)
			mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: locker(t, rdb, ns), Agent: "rebase", Policies: policies,
				Source: src, OnConflict: recordTo(ns + "results"), MaxIdleTime: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			h := mw(func(*message.Message) ([]*message.Message, error) {
				t.Error("the event ran on a held key")
				return nil, nil
			})
			deliver := func() error {
				_, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"RHEL-7"}}`)))
				return err
			}
			proxy.LoseReply(redistest.Command("evalsha", id), 1+rdb.Options().MaxRetries)
			if err := deliver(); err == nil || proxy.Cuts() != int64(1+rdb.Options().MaxRetries) {
				t.Fatalf("the conflict whose every reply was lost: %v (%d cuts), want its error", err, proxy.Cuts())
			}
			pending := func() int {
				p, err := direct.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id, End: id, Count: 1}).Result()
				if err != nil {
					t.Fatal(err)
				}
				return len(p)
			}
			if pending() != 1 {
				t.Fatal("the entry was acked, yet its worker never learned the conflict nor wrote its record")
			}
			if err := deliver(); err != nil {
				t.Fatalf("the redelivery: %v", err)
			}
			recs, err := direct.XRange(ctx, ns+"results", "-", "+").Result()
			if err != nil || len(recs) != 1 || recs[0].Values["message_id"] != id {
				t.Fatalf("records %v (%v), want one for %s", recs, err, id)
			}
			if pending() != 0 {
				t.Error("the redelivery recorded the conflict but left its entry pending")
			}
		})
	}
}
