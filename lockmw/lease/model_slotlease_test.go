package lease

// The model checker of a run's slots taken with its lease (standalone Redis,
// slots_lease.go): seeded random sequences of events on a few issues (so a lease is
// often busy: policy drop, and for some events supersede, which takes a held lease
// over), combined acquires, run ends (Release then the ack, or
// Handoff's one script), heartbeats (extend, after the lease and its slots were aged),
// crashes (a run that stops extending, whose lease and slots then expire together),
// lost replies (the proxy cuts the connection after the script ran: go-redis sends it
// again) and wakes. After every step: never more than N holders of a limit key, never
// a free slot beside a waiting event, no live slot whose holder has no live lease (but
// a run superseded and not stopped yet, which still runs), and
// no live lease without a live slot of each of its run's limit keys, expiring with it.
// At the end, faults stopped: every event ran once or was dropped once (none lost, none
// twice).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

const (
	propSlotsNoLease  = "NoSlotWithoutItsLease"
	propLeaseNoSlots  = "NoLeaseWithoutItsSlots"
	propSlotLeaseOnce = "EveryEventRunsOrDropsOnce"
)

type slotLeaseRun struct {
	le     *Lease
	stream string
	lid    string
	entry  string
	limits []Limit
}

type slotLeaseModel struct {
	*slotsModel
	runs    []*slotLeaseRun
	dead    []*slotLeaseRun
	tokens  map[string]*slotLeaseRun // every lease taken, by token
	dropped map[string]int
	seen    map[string]int // outcomes, so a test can tell the model is not vacuous
}

var slotLeaseIssues = []string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-4"}

func (m *slotLeaseModel) newEvent(a int) error {
	fair := []string{"A", "B", "C"}[a%3]
	v := map[string]any{"fair": fair, "field": a % 2, "issue": slotLeaseIssues[a/3%len(slotLeaseIssues)],
		"supersede": a % 7 / 6}
	stream := m.streams[a%5/4] // an event of priority enters the :todo stream
	id, err := m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: stream, Values: v}).Result()
	m.events = append(m.events, stream+"/"+id)
	return err
}

// deliver reads the next entry (a: of which stream first, slotsModel.next) and
// acquires its lease and slots.
func (m *slotLeaseModel) deliver(a int, lose bool) error {
	stream, msg, ok := m.next(a)
	if !ok {
		return nil
	}
	return m.acquire(stream, msg, lose)
}

// acquire is the combined acquire of entry msg: a run, the event waits for a slot
// (acked by the script), or the lease is busy (dropped: acked here).
func (m *slotLeaseModel) acquire(stream string, msg redis.XMessage, lose bool) error {
	if lose {
		m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", m.ns), redistest.Command("eval", m.ns)), 1)
	}
	req := m.request(stream, msg)
	issue, _ := msg.Values["issue"].(string)
	le, err := m.l.Acquire(m.ctx, "a", issue, AcquireOptions{MessageID: msg.ID, Slots: &req, Supersede: msg.Values["supersede"] == "1"})
	if err == nil {
		if le.Supersedes() != "" {
			m.seen["takeover"]++
		}
		r := &slotLeaseRun{le: le, stream: stream, lid: req.LineID, entry: msg.ID, limits: req.Limits}
		m.runs = append(m.runs, r)
		m.tokens[le.Token()] = r
		m.seen["run"]++
		return nil
	}
	var w *SlotsWaitingError
	if errors.As(err, &w) {
		if !w.Acked {
			return fmt.Errorf("a wait for a slot on standalone Redis was not acked in its script: %w", err)
		}
		m.seen["wait"]++
		return nil
	}
	if errors.Is(err, ErrLocked) || errors.Is(err, ErrSuperseded) {
		m.dropped[stream+"/"+req.LineID]++
		m.seen["busy"]++
		return m.direct.XAck(m.ctx, stream, "g", msg.ID).Err()
	}
	return err
}

// end ends live run i: Release then the ack, or Handoff (release and ack, one script).
func (m *slotLeaseModel) end(i int, lose, handoff bool) error {
	if len(m.runs) == 0 {
		return nil
	}
	i %= len(m.runs)
	r := m.runs[i]
	m.runs = append(m.runs[:i], m.runs[i+1:]...)
	m.ran[r.stream+"/"+r.lid]++
	if lose {
		m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", m.ns), redistest.Command("eval", m.ns)), 1)
	}
	if handoff {
		_, err := r.le.Handoff(m.ctx, Entry{Stream: r.stream, Group: "g", ID: r.entry}, nil)
		return err
	}
	if _, err := r.le.Release(m.ctx); err != nil {
		return err
	}
	return m.direct.XAck(m.ctx, r.stream, "g", r.entry).Err()
}

// crash kills live run i: its heartbeat stops; its lease and slots stay until expire.
func (m *slotLeaseModel) crash(i int) {
	if len(m.runs) == 0 {
		return
	}
	i %= len(m.runs)
	m.runs[i].le.stopHeartbeat()
	m.dead = append(m.dead, m.runs[i])
	m.runs = append(m.runs[:i], m.runs[i+1:]...)
}

// expire lets dead run i's lease pass its expiry, and its slots with it (the same
// server time), and redelivers its entry.
func (m *slotLeaseModel) expire(i int) error {
	if len(m.dead) == 0 {
		return nil
	}
	i %= len(m.dead)
	r := m.dead[i]
	m.dead = append(m.dead[:i], m.dead[i+1:]...)
	if tok, _ := m.direct.Get(m.ctx, r.le.keys.Lock).Result(); tok == r.le.token {
		if err := m.direct.Del(m.ctx, r.le.keys.Lock, r.le.keys.Info).Err(); err != nil {
			return err
		}
	}
	pipe := m.direct.TxPipeline()
	pipe.HDel(m.ctx, r.le.keys.Stop, r.le.token) // superseded: its stop's deadline passed too
	for _, lim := range r.limits {
		pipe.ZAddXX(m.ctx, m.l.SlotKeys(lim.Key).Holders, redis.Z{Score: 1, Member: r.le.token})
	}
	if _, err := pipe.Exec(m.ctx); err != nil {
		return err
	}
	msgs, err := m.direct.XRange(m.ctx, r.stream, r.entry, r.entry).Result()
	if err != nil || len(msgs) == 0 {
		return err
	}
	return m.acquire(r.stream, msgs[0], false)
}

// beat is live run i's heartbeat after time passed: its lease and slots are aged by half
// their TTL, then extended together (lose: the extend's first reply is lost).
func (m *slotLeaseModel) beat(i int, lose bool) error {
	if len(m.runs) == 0 {
		return nil
	}
	r := m.runs[i%len(m.runs)]
	if tok, _ := m.direct.Get(m.ctx, r.le.keys.Lock).Result(); tok != r.le.token {
		return nil // superseded: its heartbeat ends its run (not modelled)
	}
	now, err := m.direct.Time(m.ctx).Result()
	if err != nil {
		return err
	}
	half := m.l.opts.TTL / 2
	pipe := m.direct.TxPipeline()
	pipe.PExpire(m.ctx, r.le.keys.Lock, half)
	for _, lim := range r.limits {
		pipe.ZAddXX(m.ctx, m.l.SlotKeys(lim.Key).Holders, redis.Z{Score: float64(now.Add(half).UnixMilli()), Member: r.le.token})
	}
	if _, err := pipe.Exec(m.ctx); err != nil {
		return err
	}
	if lose {
		m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", m.ns), redistest.Command("eval", m.ns)), 1)
	}
	ok, err := r.le.extend(m.ctx)
	if err != nil || !ok {
		return fmt.Errorf("%s: the heartbeat of a live run failed: %v, %w", propLeaseNoSlots, ok, err)
	}
	return nil
}

// check holds after every step: the slots model's bound and wake-up, then slots and
// leases go together: a live slot's holder (a token, not a hand-over) holds a live
// lease, and a live lease holds a live slot of each of its limit keys expiring with it
// (within a second).
func (m *slotLeaseModel) check() error {
	if err := m.slotsModel.check(); err != nil {
		return err
	}
	t, err := m.direct.Time(m.ctx).Result()
	if err != nil {
		return err
	}
	now := float64(t.UnixMilli())
	leases := map[string]time.Duration{} // token -> its lock's TTL
	for _, issue := range slotLeaseIssues {
		lock := m.l.Keys("a", issue).Lock
		tok, err := m.direct.Get(m.ctx, lock).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return err
		}
		leases[tok] = m.direct.PTTL(m.ctx, lock).Val()
	}
	for key := range m.limits {
		hs, err := m.direct.ZRangeWithScores(m.ctx, m.l.SlotKeys(key).Holders, 0, -1).Result()
		if err != nil {
			return err
		}
		for _, h := range hs {
			tok := h.Member.(string)
			if h.Score <= now || strings.HasPrefix(tok, "w:") {
				continue
			}
			if _, ok := leases[tok]; !ok && !m.stopping(tok) {
				return m.fail(propSlotsNoLease, "%s: a live slot of %s, whose lease is not held", key, tok[:8])
			}
		}
	}
	for tok, ttl := range leases {
		r := m.tokens[tok]
		if r == nil {
			return m.fail(propLeaseNoSlots, "a lease (%s) that no acquire returned", tok[:8])
		}
		for _, lim := range r.limits {
			s, err := m.direct.ZScore(m.ctx, m.l.SlotKeys(lim.Key).Holders, tok).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			if s <= now || math.Abs(s-(now+float64(ttl.Milliseconds()))) > 1000 {
				return m.fail(propLeaseNoSlots, "the lease of %s (TTL %s) has its slot of %s until %.0f (now %.0f)", r.lid, ttl, lim.Key, s, now)
			}
		}
	}
	return nil
}

// stopping reports whether tok is a run superseded by a newer event that has not
// stopped yet (its field of the stop hash): it keeps its slots until it stops.
func (m *slotLeaseModel) stopping(tok string) bool {
	r := m.tokens[tok]
	return r != nil && m.direct.HExists(m.ctx, r.le.keys.Stop, tok).Val()
}

func (m *slotLeaseModel) do(s mStep) error {
	switch s.Kind {
	case "new":
		return m.newEvent(s.A)
	case "deliver":
		return m.deliver(s.A, s.B%4 == 0)
	case "end":
		return m.end(s.A, s.B%4 == 0, s.C%2 == 0)
	case "crash":
		m.crash(s.A)
	case "expire":
		return m.expire(s.A)
	case "beat":
		return m.beat(s.A, s.B%4 == 0)
	case "wake":
		return m.wake()
	}
	return nil
}

// settle stops the faults: the dead expire, every run ends, every entry is read, until
// nothing waits; then every event ran once or was dropped once.
func (m *slotLeaseModel) settle() error {
	for round := range 400 {
		for len(m.dead) > 0 {
			if err := m.expire(0); err != nil {
				return err
			}
		}
		for len(m.runs) > 0 {
			if err := m.end(0, false, false); err != nil {
				return err
			}
			if err := m.check(); err != nil {
				return err
			}
		}
		done, err := m.allRead()
		if err != nil {
			return err
		}
		if done {
			break
		}
		if err := m.deliver(round, false); err != nil {
			return err
		}
		if err := m.check(); err != nil {
			return err
		}
	}
	for _, ev := range m.events {
		if m.ran[ev]+m.dropped[ev] != 1 {
			return m.fail(propSlotLeaseOnce, "event %s ran %d times and was dropped %d times (events %d)", ev, m.ran[ev],
				m.dropped[ev], len(m.events))
		}
	}
	return nil
}

func genSlotLeaseSteps(r *rand.Rand, n int) []mStep {
	kinds := []string{"new", "new", "new", "deliver", "deliver", "deliver", "end", "end", "crash", "expire", "beat", "wake"}
	steps := make([]mStep, n)
	for i := range steps {
		steps[i] = mStep{Kind: kinds[r.IntN(len(kinds))], A: r.IntN(100), B: r.IntN(100), C: r.IntN(100)}
	}
	return steps
}

func (e *modelEnv) runSlotLease(steps []mStep, seen map[string]int) error {
	ns := redistest.Namespace()
	defer redistest.DeleteNamespace(context.Background(), e.direct, ns)
	l, err := New(e.client, Options{Scope: ns, TTL: time.Minute})
	if err != nil {
		return err
	}
	m := &slotLeaseModel{slotsModel: &slotsModel{ctx: context.Background(), direct: e.direct, proxy: e.proxy, l: l, ns: ns,
		streams: [2]string{"{" + ns + "s}", "{" + ns + "s}:todo"}, limits: map[string]int64{}, ran: map[string]int{}},
		tokens: map[string]*slotLeaseRun{}, dropped: map[string]int{}, seen: seen}
	defer func() {
		for _, r := range append(m.runs, m.dead...) {
			r.le.stopHeartbeat()
		}
	}()
	for _, stream := range m.streams {
		if err := e.direct.XGroupCreateMkStream(m.ctx, stream, "g", "0").Err(); err != nil {
			return err
		}
	}
	for i, s := range steps {
		if os.Getenv("MODEL_TRACE") != "" {
			e.t.Logf("step %d: %s runs %d dead %d", i, s, len(m.runs), len(m.dead))
		}
		if err := m.do(s); err != nil {
			return &stepError{at: i, err: err}
		}
		if err := m.check(); err != nil {
			return &stepError{at: i, err: err}
		}
	}
	return m.settle()
}

func (e *modelEnv) checkSlotLeaseSeeds(from, n int, seen map[string]int) (int, error) {
	for seed := from; seed < from+n; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 3739))
		if err := e.runSlotLease(genSlotLeaseSteps(r, 80), seen); err != nil {
			return seed, fmt.Errorf("seed %s: %w", strconv.Itoa(seed), err)
		}
	}
	return 0, nil
}

// TestModelLeaseSlotsWithLease runs seeded random sequences against the slots taken,
// renewed and freed with the lease (MODEL_SEEDS=N, MODEL_SEED=S as TestModelLease).
func TestModelLeaseSlotsWithLease(t *testing.T) {
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 24)
	start := time.Now()
	seen := map[string]int{}
	if seed, err := e.checkSlotLeaseSeeds(from, n, seen); err != nil {
		t.Fatalf("slots-with-lease model checker: seed %d fails: %v", seed, err)
	}
	t.Logf("%d seeds of 80 steps in %s: acquires %v", n, time.Since(start).Round(time.Millisecond), seen)
	if n >= 24 && (seen["run"] == 0 || seen["wait"] == 0 || seen["busy"] == 0 || seen["takeover"] == 0) {
		t.Fatalf("the sequences never reached an outcome (runs, waits for a slot, busy leases, take-overs): %v", seen)
	}
}

// TestModelLeaseSlotsWithLeasePlanted plants, each in turn: a combined acquire that
// takes the slots when the lease is busy; one that runs the policy's acquire (taking
// the lease) while a slot is full; one that lets supersede take a held lease over while
// a slot is full; an extend that forgets the slots; a release that
// keeps them. The checker must catch each as the property it breaks.
func TestModelLeaseSlotsWithLeasePlanted(t *testing.T) {
	cases := []struct {
		name     string
		src      *string
		old, new string
		prop     string
	}{
		{"slots-taken-when-the-lease-is-busy", &slotsLeaseLua, "if r[1] == 1 and not full then", "if not full then", propSlotsNoLease},
		{"lease-taken-with-a-slot-full", &slotsLeaseLua, "if not full or (held and not so.takeover) then", "if true then", propLeaseNoSlots},
		{"takeover-with-a-slot-full", &slotsLeaseLua, "if not full or (held and not so.takeover) then", "if not full or held then", propLeaseNoSlots},
		{"extend-forgets-the-slots", &extendLua, "for i = nk + 1, #KEYS do redis.call('ZADD'", "for i = nk + 1, 0 do redis.call('ZADD'", propLeaseNoSlots},
		{"release-keeps-the-slots", &slotsLeaseLua, "for i = 1, slots_n do slots_pass(slots_key(i), so.token, now) end", "", propSlotsNoLease},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			planted := plantLua(t, *c.src, c.old, c.new)
			saved, savedExtend := *c.src, extendScript
			*c.src = planted
			extendScript = newScript(extendLua)
			withSlots = slotScripts()
			t.Cleanup(func() {
				*c.src, extendScript = saved, savedExtend
				withSlots = slotScripts()
			})
			e := newModelEnv(t)
			seed, err := e.checkSlotLeaseSeeds(1, 24, map[string]int{})
			requireCaught(t, "the model checker did not catch the planted defect", seed, err, c.prop)
		})
	}
}
