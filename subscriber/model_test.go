package subscriber_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/subscriber"
)

// The subscriber model's properties. The read loop runs on its own goroutines against
// a real Redis while the model adds entries; takes, acks (some settled: their XACK sent
// elsewhere first) and nacks messages; ages the pending list (time passing: any
// consumer's claim pass may take them); hands the read-ahead back; drains, closes and
// crashes subscribers; and loses replies.
const (
	// NothingLost, after every step: an entry no handler acked is pending in the group
	// or not yet read.
	propNothingLost = "NothingLost"
	// AckSent, after a subscriber closes: every entry a handler acked has left the
	// pending list.
	propAckSent = "AckSent"
	// EveryReadEnds, after a subscriber closes: each time its Observer heard an entry
	// read, it heard that entry ended or given back, or the model handed it back or
	// holds its message unacked.
	propEveryReadEnds = "EveryReadEnds"
	// GivenBack, after a subscriber closes: an entry it gave back and still pending for
	// it is idle past MaxIdleTime, for any consumer's next claim pass.
	propGivenBack = "GivenBack"
	// AllHandled, at the end: a fresh consumer takes and handles every entry no handler
	// acked.
	propAllHandled = "AllHandled"
	// NothingUnseen, after a read's reply is lost: an entry added then is, within a
	// few seconds, unread or pending for a consumer whose Observer heard it read (the
	// read that delivered it failed, and the reader took what it had delivered),
	// never ours unseen until MaxIdleTime. After a claim pass's reply is lost: every
	// pending entry is, within a few seconds, heard read as often as it was delivered
	// since (the claim failed, and the reader took what it had claimed).
	propNothingUnseen = "NothingUnseen"
)

// modelMaxIdle is MaxIdleTime in the model: longer than any run, so only the model's
// age step (time passing) makes an entry claimable.
const modelMaxIdle = time.Minute

// tally is an Observer that counts what it heard, per entry (the model's, and the
// nack test's).
type tally struct {
	mu                    sync.Mutex
	read, ended, gaveBack map[string]int
	lastGaveBack          map[string]bool // the entry's last word was GaveBack
}

func newTally() *tally {
	return &tally{read: map[string]int{}, ended: map[string]int{}, gaveBack: map[string]int{}, lastGaveBack: map[string]bool{}}
}

func (o *tally) Reading() func() { return func() {} }

func (o *tally) Read(_ string, msgs []redis.XMessage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range msgs {
		o.read[m.ID]++
		o.lastGaveBack[m.ID] = false
	}
}

func (o *tally) Ended(_, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended[id]++
	o.lastGaveBack[id] = false
}

// readTimes is how often the Observer heard that entry id was read.
func (o *tally) readTimes(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.read[id]
}

// endedTimes is how often the Observer heard that entry id ended.
func (o *tally) endedTimes(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ended[id]
}

func (o *tally) GaveBack(_ string, ids []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		o.gaveBack[id]++
		o.lastGaveBack[id] = true
	}
}

// mSub is one subscriber of the model and what its handler holds.
type mSub struct {
	name   string
	sub    *subscriber.Subscriber
	client *redis.Client
	msgs   <-chan *message.Message
	// unsubscribe ends the Subscribe's context: the reader ends without Close.
	unsubscribe context.CancelFunc
	obs         *tally
	held        []*message.Message // handed over, neither acked nor nacked
	acked       []string           // entries its handler acked
	handedBack  map[string]int
	drained     bool
}

// sWorld is one seed's run.
type sWorld struct {
	t       *testing.T
	rng     *rand.Rand
	direct  *redis.Client
	proxy   *redistest.LossyProxy
	stream  string
	subs    []*mSub
	added   []string
	handled map[string]bool // acked by a handler whose ack was not lost with its process
	// inFlight: acked by the handler of a crashed subscriber, still pending at the
	// crash: its XACK may have been on the wire (it lands or not, both are right).
	inFlight map[string]bool
	names    int
	tallies  map[string][]*tally // by consumer name: the Observers of its subscribers
	// endedAt is when a subscriber of a consumer name last closed or crashed: a
	// blocking read of its still in flight takes entries for that name that no
	// subscriber sees (they wait for MaxIdleTime, or a start-up pass).
	endedAt map[string]time.Time
	trace   []string
}

// TestModelSubscriber runs seeded random sequences of steps against the read loop and
// checks the properties after every step. MODEL_SEED picks one seed, MODEL_SEEDS how
// many (default 12); MODEL_TRACE=1 logs each seed's steps.
func TestModelSubscriber(t *testing.T) {
	t.Parallel()
	direct, ns := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	from, n := redistest.ModelSeeds(t, 12)
	for seed := from; seed < from+n; seed++ {
		w := &sWorld{t: t, rng: rand.New(rand.NewPCG(uint64(seed), 47)), direct: direct, proxy: proxy,
			stream: fmt.Sprintf("%ss%d", ns, seed), handled: map[string]bool{}, inFlight: map[string]bool{},
			tallies: map[string][]*tally{}, endedAt: map[string]time.Time{}}
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { w.t = t; w.run() }) {
			return
		}
	}
}

// run runs one seed: steps with a check after each, then every subscriber closed and
// the rest handled by a fresh one.
func (w *sWorld) run() {
	defer w.proxy.Disarm()
	for range 2 {
		w.start("")
	}
	for i := range 40 {
		w.step(i)
		w.checkNothingLost()
	}
	for len(w.subs) > 0 {
		w.closeSub(w.subs[0])
	}
	w.drainRest()
	if os.Getenv("MODEL_TRACE") != "" {
		w.t.Logf("trace:\n%s", strings.Join(w.trace, "\n"))
	}
}

func (w *sWorld) fail(prop, format string, a ...any) {
	w.t.Helper()
	w.t.Fatalf("%s: %s\ntrace:\n%s", prop, fmt.Sprintf(format, a...), strings.Join(w.trace, "\n"))
}

func (w *sWorld) logf(format string, a ...any) {
	w.trace = append(w.trace, fmt.Sprintf(format, a...))
}

// start starts a subscriber named name (a fresh name when empty) on the stream,
// through the lossy proxy, with a seeded read-ahead and nack sleep.
func (w *sWorld) start(name string) {
	if name == "" {
		name = fmt.Sprintf("c%d", w.names)
		w.names++
	}
	opts := *w.direct.Options()
	opts.Addr, opts.MaxRetries = w.proxy.Addr(), 3
	client := redis.NewClient(&opts)
	obs := newTally()
	w.tallies[name] = append(w.tallies[name], obs)
	cfg := subscriber.Config{Client: client, Group: "g", Consumer: name, BlockTime: 30 * time.Millisecond,
		ClaimInterval: 20 * time.Millisecond, MaxIdleTime: modelMaxIdle, ReadBatch: 1 + w.rng.IntN(4),
		KeepAhead: 1 + w.rng.IntN(3), NackResendSleep: time.Duration(w.rng.IntN(2)) * 30 * time.Millisecond,
		ClaimBatch: 1 + w.rng.IntN(3), ShouldClaim: vetoFirst(), Observer: obs}
	sub, err := subscriber.New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, w.stream)
	if err != nil {
		w.t.Fatal(err)
	}
	w.subs = append(w.subs, &mSub{name: name, sub: sub, client: client, msgs: msgs, unsubscribe: cancel, obs: obs,
		handedBack: map[string]int{}})
	w.logf("start %s (read %d, ahead %d, nack sleep %s, claim batch %d)", name, cfg.ReadBatch, cfg.KeepAhead,
		cfg.NackResendSleep, cfg.ClaimBatch)
}

// vetoFirst is a claim veto that refuses each entry the first time it is asked about
// (the lease's veto refuses an entry whose issue is held), and allows it after.
func vetoFirst() func(context.Context, redis.XPendingExt) bool {
	var mu sync.Mutex
	asked := map[string]bool{}
	return func(_ context.Context, p redis.XPendingExt) bool {
		mu.Lock()
		defer mu.Unlock()
		first := !asked[p.ID]
		asked[p.ID] = true
		return !first
	}
}

// step takes one seeded step.
func (w *sWorld) step(i int) {
	s := w.subs[w.rng.IntN(len(w.subs))]
	switch k := w.rng.IntN(21); {
	case k < 4:
		w.add()
	case k < 9:
		w.take(s, 50*time.Millisecond)
	case k < 12:
		w.ack(s)
	case k < 13:
		w.settleAck(s)
	case k < 15:
		w.nack(s)
	case k < 16:
		w.age()
	case k < 17:
		w.handBack(s)
	case k < 18:
		w.toggleDrain(s)
	case k < 19:
		w.loseReply()
	case k < 20:
		w.closeSub(s)
		w.start(w.restartName(s))
	default:
		w.crash(s)
		w.start(w.restartName(s))
	}
}

// restartName is the name a restarted subscriber takes: its own (the same pod) or a
// fresh one (a new pod).
func (w *sWorld) restartName(s *mSub) string {
	if w.rng.IntN(2) == 0 {
		return s.name
	}
	return ""
}

func (w *sWorld) add() {
	msg, err := event.New(event.TriageRequested, "RHEL-1", event.Task{}, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	id, err := w.direct.XAdd(context.Background(), &redis.XAddArgs{Stream: w.stream, Values: event.Encode(msg)}).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	w.added = append(w.added, id)
	w.logf("add %s", id)
}

// take receives the next message s hands over, waiting up to d.
func (w *sWorld) take(s *mSub, d time.Duration) bool {
	select {
	case m, ok := <-s.msgs:
		if !ok {
			w.t.Fatalf("%s: the message channel closed while subscribed", s.name)
		}
		s.held = append(s.held, m)
		w.logf("%s takes %s", s.name, event.EntryID(m))
		return true
	case <-time.After(d):
		return false
	}
}

// pickHeld removes and returns a random message s holds.
func (w *sWorld) pickHeld(s *mSub) *message.Message {
	if len(s.held) == 0 {
		return nil
	}
	i := w.rng.IntN(len(s.held))
	m := s.held[i]
	s.held = slices.Delete(s.held, i, i+1)
	return m
}

func (w *sWorld) ack(s *mSub) {
	if m := w.pickHeld(s); m != nil {
		id := event.EntryID(m)
		m.Ack()
		s.acked = append(s.acked, id)
		w.handled[id] = true
		w.logf("%s acks %s", s.name, id)
	}
}

// settleAck acks a message as the lock middleware's release does: its XACK sent
// elsewhere first, the subscriber told (Settle), then the message acked.
func (w *sWorld) settleAck(s *mSub) {
	m := w.pickHeld(s)
	if m == nil {
		return
	}
	id := event.EntryID(m)
	if err := w.direct.XAck(context.Background(), w.stream, "g", id).Err(); err != nil {
		w.t.Fatal(err)
	}
	s.sub.Settle(w.stream, id)
	m.Ack()
	s.acked = append(s.acked, id)
	w.handled[id] = true
	w.logf("%s settles and acks %s", s.name, id)
}

func (w *sWorld) nack(s *mSub) {
	if m := w.pickHeld(s); m != nil {
		m.Nack()
		w.logf("%s nacks %s", s.name, event.EntryID(m))
	}
}

// age makes every pending entry idle past MaxIdleTime, its consumer unchanged: time
// passes, and any consumer's claim pass may take it.
func (w *sWorld) age() {
	ctx := context.Background()
	for _, p := range w.pending(ctx) {
		w.markIdle(ctx, p.Consumer, p.ID)
	}
	w.logf("age")
}

func (w *sWorld) markIdle(ctx context.Context, consumer, id string) {
	err := w.direct.Do(ctx, "XCLAIM", w.stream, "g", consumer, 0, id,
		"IDLE", (modelMaxIdle + time.Second).Milliseconds(), "JUSTID").Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		w.t.Fatal(err)
	}
}

// handBack takes s's read-ahead, as the lock middleware does before a long run, and
// marks it idle for the group.
func (w *sWorld) handBack(s *mSub) {
	ids := s.sub.HandBack(w.stream)
	for _, id := range ids {
		s.handedBack[id]++
		w.markIdle(context.Background(), s.name, id)
	}
	w.logf("%s hands back %v", s.name, ids)
}

func (w *sWorld) toggleDrain(s *mSub) {
	s.drained = !s.drained
	if s.drained {
		s.sub.Drain()
	} else {
		s.sub.Undrain()
	}
	w.logf("%s drain=%v", s.name, s.drained)
}

// loseReply arms the proxy to lose the reply of one command of the read loop's. After
// a read's (XREADGROUP) or a claim pass's (XCLAIM) it checks NothingUnseen.
func (w *sWorld) loseReply() {
	cmds := []redistest.Match{redistest.Command("XACK"), redistest.Command("XREADGROUP"),
		redistest.Command("XPENDING"), redistest.Command("XCLAIM", "IDLE"), claimPass}
	i := w.rng.IntN(len(cmds))
	w.proxy.LoseReply(cmds[i], 1)
	w.logf("lose the next reply of %v", []string{"XACK", "XREADGROUP", "XPENDING", "XCLAIM IDLE", "XCLAIM (claim pass)"}[i])
	switch i {
	case 1:
		// The reads in flight end (BlockTime), the next one takes the loss: an entry
		// added now is what it delivers, unless another read takes it first.
		time.Sleep(40 * time.Millisecond)
		added := time.Now()
		w.add()
		w.checkNothingUnseen(w.added[len(w.added)-1], added)
	case 4:
		// Time passes: the next claim pass that takes an entry takes the loss. Once
		// every entry was claimed again (or a second passed), none is ours unseen.
		// (Counted from after the age: a claim before it that lost its reply left
		// its entries idle again, for the next pass.)
		w.age()
		before := w.deliveries()
		redistest.Within(time.Second, w.noneIdle)
		w.checkClaimsSeen(before, time.Now())
	}
}

// noneIdle reports whether no pending entry is idle past MaxIdleTime.
func (w *sWorld) noneIdle() bool {
	return !slices.ContainsFunc(w.pending(context.Background()), func(p redis.XPendingExt) bool { return p.Idle >= modelMaxIdle })
}

// claimPass matches a claim pass's XCLAIM: not a give-back's (IDLE), nor a recovery's
// (RETRYCOUNT).
func claimPass(args []string) bool {
	return redistest.Command("XCLAIM")(args) && !redistest.Command("XCLAIM", "IDLE")(args) &&
		!redistest.Command("XCLAIM", "RETRYCOUNT")(args)
}

// delivered is, for an entry, how often Redis delivered it (its pending entry's
// delivery count; 0 when not pending) and how often any Observer heard it read.
type delivered struct{ count, reads int }

// deliveries is delivered for every entry added.
func (w *sWorld) deliveries() map[string]delivered {
	d := make(map[string]delivered, len(w.added))
	for _, id := range w.added {
		d[id] = delivered{reads: w.readsOf(id)}
	}
	for _, p := range w.pending(context.Background()) {
		d[p.ID] = delivered{count: int(p.RetryCount), reads: d[p.ID].reads}
	}
	return d
}

// readsOf is how often any subscriber's Observer heard entry id read.
func (w *sWorld) readsOf(id string) int {
	n := 0
	for _, ts := range w.tallies {
		for _, o := range ts {
			n += o.readTimes(id)
		}
	}
	return n
}

// checkClaimsSeen checks that within three seconds every pending entry not idle past
// MaxIdleTime (those are any claim pass's) that Redis delivered (a claim pass's
// XCLAIM) since before was heard read as often since, but for a consumer whose
// subscriber ended less than a read's BLOCK before at (its read may have taken it): a
// claim whose reply was lost leaves none ours unseen.
func (w *sWorld) checkClaimsSeen(before map[string]delivered, at time.Time) {
	var msg string
	seen := func() bool {
		for _, p := range w.pending(context.Background()) {
			b := before[p.ID]
			sent, heard := int(p.RetryCount)-b.count, w.readsOf(p.ID)-b.reads
			if sent > heard && p.Idle < modelMaxIdle && !w.justEnded(p.Consumer, at) {
				msg = fmt.Sprintf("entry %s is pending for %s, delivered %d times since the age step, idle %s, heard read %d times",
					p.ID, p.Consumer, sent, p.Idle, heard)
				return false
			}
		}
		return true
	}
	if !redistest.Within(3*time.Second, seen) {
		w.fail(propNothingUnseen, "%s", msg)
	}
}

// checkNothingUnseen checks that entry id, added at added, is within three seconds
// unread or pending for a consumer one of whose subscribers' Observer heard it read,
// or whose subscriber ended less than a read's BLOCK before (its read may have taken it).
func (w *sWorld) checkNothingUnseen(id string, added time.Time) {
	var at string
	seen := func() bool {
		at = ""
		for _, p := range w.pending(context.Background()) {
			if p.ID != id {
				continue
			}
			at = p.Consumer
			if w.justEnded(p.Consumer, added) {
				return true
			}
			return slices.ContainsFunc(w.tallies[p.Consumer], func(o *tally) bool { return o.readTimes(id) > 0 })
		}
		return true
	}
	if !redistest.Within(3*time.Second, seen) {
		w.fail(propNothingUnseen, "entry %s is pending for %s, whose subscribers never read it", id, at)
	}
}

// justEnded reports whether a subscriber of consumer ended less than a read's BLOCK
// (and then some) before at: a read of its still in flight may have taken entries for
// that name that no subscriber sees.
func (w *sWorld) justEnded(consumer string, at time.Time) bool {
	return at.Sub(w.endedAt[consumer]) < 100*time.Millisecond
}

// closeSub closes s and checks what a closed subscriber leaves behind.
// Half the time its Subscribe context ends first (a router that stops its handler),
// and the model takes what is still handed over until the channel closes.
func (w *sWorld) closeSub(s *mSub) {
	if w.rng.IntN(2) == 0 {
		s.unsubscribe()
		for m := range s.msgs {
			s.held = append(s.held, m)
		}
		w.logf("unsubscribe %s", s.name)
	}
	if err := s.sub.Close(); err != nil {
		w.t.Fatalf("%s: Close: %v", s.name, err)
	}
	w.logf("close %s (holding %d)", s.name, len(s.held))
	w.endedAt[s.name] = time.Now()
	w.remove(s)
	w.checkEveryReadEnds(s)
	w.checkAckSent(s)
	w.checkGivenBack(s)
	s.unsubscribe()
	_ = s.client.Close()
}

// crash stops s with its client closed first: queued acks are lost with the process,
// and so is its handler's work on them (their entries are pending, to run again).
func (w *sWorld) crash(s *mSub) {
	_ = s.client.Close()
	_ = s.sub.Close()
	s.unsubscribe()
	w.endedAt[s.name] = time.Now()
	w.remove(s)
	pend := w.pendingSet(context.Background())
	for _, id := range s.acked {
		if pend[id] {
			delete(w.handled, id)
			w.inFlight[id] = true
		}
	}
	w.logf("crash %s (holding %d)", s.name, len(s.held))
}

func (w *sWorld) remove(s *mSub) {
	w.subs = slices.DeleteFunc(w.subs, func(x *mSub) bool { return x == s })
}

func (w *sWorld) pending(ctx context.Context) []redis.XPendingExt {
	p, err := w.direct.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: w.stream, Group: "g", Start: "-", End: "+", Count: 10000}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		w.t.Fatal(err)
	}
	return p
}

func (w *sWorld) pendingSet(ctx context.Context) map[string]bool {
	set := map[string]bool{}
	for _, p := range w.pending(ctx) {
		set[p.ID] = true
	}
	return set
}

// checkNothingLost: the group's last delivered id is read before the pending list, so
// an entry read in between counts as not yet read, never as lost.
func (w *sWorld) checkNothingLost() {
	ctx := context.Background()
	groups, err := w.direct.XInfoGroups(ctx, w.stream).Result()
	if err != nil || len(groups) != 1 {
		w.t.Fatalf("XINFO GROUPS: %v %v", groups, err)
	}
	last := groups[0].LastDeliveredID
	pend := w.pendingSet(ctx)
	for _, id := range w.added {
		if !w.handled[id] && !w.inFlight[id] && !pend[id] && streamid.Compare(id, last) <= 0 {
			w.fail(propNothingLost, "entry %s: no handler acked it, yet it is neither pending nor unread (last delivered %s)", id, last)
		}
	}
}

// checkAckSent: Close sends the acks still queued.
func (w *sWorld) checkAckSent(s *mSub) {
	pend := w.pendingSet(context.Background())
	for _, id := range s.acked {
		if pend[id] {
			w.fail(propAckSent, "%s closed; entry %s, acked by its handler, is still pending", s.name, id)
		}
	}
}

// checkEveryReadEnds waits (the end of a read in flight at Close gives back later)
// until each read s's Observer heard is matched by an end, a give-back, a hand-back or
// a message the model holds.
func (w *sWorld) checkEveryReadEnds(s *mSub) {
	heldNow := map[string]int{}
	for _, m := range s.held {
		heldNow[event.EntryID(m)]++
	}
	var msg string
	balanced := func() bool {
		s.obs.mu.Lock()
		defer s.obs.mu.Unlock()
		for id, n := range s.obs.read {
			if got := s.obs.ended[id] + s.obs.gaveBack[id] + s.handedBack[id] + heldNow[id]; got != n {
				msg = fmt.Sprintf("%s closed; entry %s read %d times, but ended %d, given back %d, handed back %d, held %d",
					s.name, id, n, s.obs.ended[id], s.obs.gaveBack[id], s.handedBack[id], heldNow[id])
				return false
			}
		}
		return true
	}
	if !redistest.Within(2*time.Second, balanced) {
		w.fail(propEveryReadEnds, "%s", msg)
	}
}

// checkGivenBack waits until every entry s gave back last and still pending for s is
// idle past MaxIdleTime.
func (w *sWorld) checkGivenBack(s *mSub) {
	var msg string
	given := func() bool {
		s.obs.mu.Lock()
		last := maps.Clone(s.obs.lastGaveBack)
		s.obs.mu.Unlock()
		for _, p := range w.pending(context.Background()) {
			if p.Consumer == s.name && last[p.ID] && p.Idle < modelMaxIdle {
				msg = fmt.Sprintf("%s closed; entry %s given back is pending for it, idle %s only", s.name, p.ID, p.Idle)
				return false
			}
		}
		return true
	}
	if !redistest.Within(2*time.Second, given) {
		w.fail(propGivenBack, "%s", msg)
	}
}

// drainRest has a fresh subscriber take and ack until every entry no handler acked is
// handled, aging the pending list whenever nothing comes.
func (w *sWorld) drainRest() {
	w.age()
	w.start("")
	s := w.subs[0]
	deadline := time.Now().Add(15 * time.Second)
	for w.unhandled() > 0 {
		if time.Now().After(deadline) {
			w.fail(propAllHandled, "%d entries never handled; pending %+v", w.unhandled(), w.pending(context.Background()))
		}
		if w.take(s, 100*time.Millisecond) {
			w.ack(s)
			continue
		}
		w.age() // an entry read with a lost reply waits for MaxIdleTime: let it pass
	}
	w.closeSub(s)
}

// unhandled is how many entries no handler acked (an ack on the wire at a crash that
// landed counts).
func (w *sWorld) unhandled() int {
	pend := w.pendingSet(context.Background())
	n := 0
	for _, id := range w.added {
		if !w.handled[id] && (!w.inFlight[id] || pend[id]) {
			n++
		}
	}
	return n
}
