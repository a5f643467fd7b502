package lease

// The concurrency limits' model checker (issue 37 item 2): seeded random sequences of
// events, takes, run ends, crashes (a run that never frees its slots, one that dies
// between its two limit keys), slots that expire (a dead holder's lease), lost replies
// (the proxy cuts the connection after the script ran: go-redis sends it again) and
// wakes, against the real scripts on a real Redis, standalone and Cluster key layouts.
// After every step: never more than N live holders of a limit key, and never a free
// slot beside a waiting event (a lost wake-up). At the end, with faults stopped: every
// event ran to its end exactly once (no waiter lost, none run twice). Events enter two
// streams, as an agent's do: its own, and its :todo stream (the priority lane), whose
// entry ids repeat the other's.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

const (
	propSlotsBound = "AtMostNHolders"
	propSlotsWake  = "NoFreeSlotBesideAWaiter"
	propSlotsOnce  = "EveryEventRunsOnce"
)

type slotRun struct {
	s      *Slots
	stream string
	lid    string
	entry  string
}

type slotsModel struct {
	ctx    context.Context
	direct *redis.Client
	proxy  *redistest.LossyProxy
	l      *Locker
	ns     string
	// streams are the agent's stream and its :todo stream (events of priority).
	streams [2]string
	limits  map[string]int64 // limit key -> N
	runs    []*slotRun       // live runs
	dead    []*slotRun       // crashed runs: entries still pending, slots held till expiry
	ran     map[string]int   // stream/lid -> runs ended
	events  []string         // stream/lid of the events published
	seq     int
}

func (m *slotsModel) fail(prop, format string, args ...any) error {
	return fmt.Errorf("%s: %s", prop, fmt.Sprintf(format, args...))
}

// limitsOf are an event's limit keys: the agent's (N 2), and half the events a field's
// (N 1), by its fair value.
func (m *slotsModel) limitsOf(fair string, field bool) []Limit {
	out := []Limit{{Key: "agent:a", N: 2}}
	if field {
		out = append(out, Limit{Key: "field:c=" + fair, N: 1})
	}
	for _, l := range out {
		m.limits[l.Key] = l.N
	}
	return out
}

func (m *slotsModel) newEvent(a int) error {
	m.seq++
	fair := []string{"A", "B", "C"}[a%3]
	v := map[string]any{"fair": fair, "field": a % 2}
	stream := m.streams[a%5/4]
	id, err := m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: stream, Values: v}).Result()
	m.events = append(m.events, stream+"/"+id)
	return err
}

// request is the take of entry msg of stream (lid: its slot_from, else its id).
func (m *slotsModel) request(stream string, msg redis.XMessage) SlotRequest {
	lid := msg.ID
	if from, ok := msg.Values["slot_from"].(string); ok {
		lid = from
	}
	fields := map[string]any{"slot_from": lid}
	for k, v := range msg.Values {
		if k != "slot_from" {
			fields[k] = v
		}
	}
	fair, _ := msg.Values["fair"].(string)
	return SlotRequest{Limits: m.limitsOf(fair, msg.Values["field"] == "1"), LineID: lid, Issue: "RHEL-1",
		Priority: strings.HasSuffix(stream, ":todo"), Fair: fair, Weight: 1 + int64(len(fair)%2),
		Event: QueuedEvent{Stream: stream, Fields: fields}, Hold: time.Minute,
		Ack: &Entry{Stream: stream, Group: "g", ID: msg.ID}}
}

// next reads the next entry, of the stream first (a: its :todo stream first when odd)
// or, when it has none, of the other.
func (m *slotsModel) next(a int) (string, redis.XMessage, bool) {
	for i := range 2 {
		stream := m.streams[(a+i)%2]
		res, err := m.direct.XReadGroup(m.ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"},
			Count: 1, Block: -1}).Result()
		if err == nil && len(res) > 0 && len(res[0].Messages) > 0 {
			return stream, res[0].Messages[0], true
		}
	}
	return "", redis.XMessage{}, false
}

// deliver reads the next entry (a: of which stream first; lose: the take's first reply
// is lost) and takes its slots: a run, or the event waits (acked: on Cluster here).
func (m *slotsModel) deliver(a int, lose bool) error {
	stream, msg, ok := m.next(a)
	if !ok {
		return nil
	}
	return m.take(stream, msg, lose)
}

func (m *slotsModel) take(stream string, msg redis.XMessage, lose bool) error {
	if lose {
		m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", m.ns), redistest.Command("eval", m.ns)), 1)
	}
	req := m.request(stream, msg)
	s, err := m.l.TakeSlots(m.ctx, req)
	if err == nil {
		m.runs = append(m.runs, &slotRun{s: s, stream: stream, lid: req.LineID, entry: msg.ID})
		return nil
	}
	var w *SlotsWaitingError
	if errors.As(err, &w) {
		if !w.Acked {
			return m.direct.XAck(m.ctx, stream, "g", msg.ID).Err()
		}
		return nil
	}
	return err
}

// end ends live run i normally (lose: the first free's reply is lost): its slots freed,
// its entry acked.
func (m *slotsModel) end(i int, lose bool) error {
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
	if err := r.s.Release(m.ctx); err != nil {
		return err
	}
	return m.direct.XAck(m.ctx, r.stream, "g", r.entry).Err()
}

// crash kills live run i: nothing freed, its entry pending.
func (m *slotsModel) crash(i int) {
	if len(m.runs) == 0 {
		return
	}
	i %= len(m.runs)
	m.dead = append(m.dead, m.runs[i])
	m.runs = append(m.runs[:i], m.runs[i+1:]...)
}

// crashBetween delivers the next entry but dies after its first limit key's take (a
// slot held by nobody alive), leaving the entry pending.
func (m *slotsModel) crashBetween(a int) error {
	stream, msg, ok := m.next(a)
	if !ok {
		return nil
	}
	req := m.request(stream, msg)
	rec, err := slotRecord(req)
	if err != nil {
		return err
	}
	s := &Slots{l: m.l, token: newToken(), lid: slotMember(req), hold: req.Hold}
	taken, err := m.l.takeSlot(m.ctx, s, req, req.Limits[0], rec)
	if err != nil {
		return err
	}
	if atoi(taken[0]) != 1 { // it waits: no slot held; its ack is the caller's on Cluster
		return m.direct.XAck(m.ctx, stream, "g", msg.ID).Err()
	}
	s.limits = req.Limits[:1]
	m.dead = append(m.dead, &slotRun{s: s, stream: stream, lid: req.LineID, entry: msg.ID})
	return nil
}

// expire lets dead run i's slots pass their expiry (its lease would have expired), and
// its entry is redelivered.
func (m *slotsModel) expire(i int) error {
	if len(m.dead) == 0 {
		return nil
	}
	i %= len(m.dead)
	r := m.dead[i]
	m.dead = append(m.dead[:i], m.dead[i+1:]...)
	for _, lim := range r.s.limits {
		k := m.l.SlotKeys(lim.Key).Holders
		if err := m.direct.ZAddXX(m.ctx, k, redis.Z{Score: 1, Member: r.s.token}).Err(); err != nil {
			return err
		}
	}
	msgs, err := m.direct.XRange(m.ctx, r.stream, r.entry, r.entry).Result()
	if err != nil || len(msgs) == 0 {
		return err
	}
	return m.take(r.stream, msgs[0], false)
}

func (m *slotsModel) wake() error {
	for key, n := range m.limits {
		if _, err := m.l.WakeSlots(m.ctx, Limit{Key: key, N: n}, time.Minute, 0); err != nil {
			return err
		}
	}
	return nil
}

// check holds after every step: at most N holders (live or not yet found expired) per
// key, at most N live runs per key, and no free slot while events wait.
func (m *slotsModel) check() error {
	live := map[string]int64{}
	for _, r := range m.runs {
		for _, lim := range r.s.limits {
			live[lim.Key]++
		}
	}
	for key, n := range m.limits {
		k := m.l.SlotKeys(key)
		held, err := m.direct.ZCard(m.ctx, k.Holders).Result()
		if err != nil {
			return err
		}
		w1, _ := m.direct.ZCard(m.ctx, k.Wait1).Result()
		w2, _ := m.direct.ZCard(m.ctx, k.Wait2).Result()
		if held > n || live[key] > n {
			return m.fail(propSlotsBound, "%s: %d holders, %d live runs, limit %d", key, held, live[key], n)
		}
		if held < n && w1+w2 > 0 {
			return m.fail(propSlotsWake, "%s: %d of %d slots held while %d events wait", key, held, n, w1+w2)
		}
	}
	return nil
}

func (m *slotsModel) do(s mStep) error {
	switch s.Kind {
	case "new":
		return m.newEvent(s.A)
	case "deliver":
		return m.deliver(s.A, s.B%4 == 0)
	case "end":
		return m.end(s.A, s.B%4 == 0)
	case "crash":
		m.crash(s.A)
	case "between":
		return m.crashBetween(s.A)
	case "expire":
		return m.expire(s.A)
	case "wake":
		return m.wake()
	}
	return nil
}

// settle stops the faults: the dead expire, every run ends, every entry is read, until
// nothing waits; then every event ran once.
func (m *slotsModel) settle() error {
	for round := 0; round < 400; round++ {
		for len(m.dead) > 0 {
			if err := m.expire(0); err != nil {
				return err
			}
		}
		for len(m.runs) > 0 {
			if err := m.end(0, false); err != nil {
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
		if done && !m.handedLeft() {
			break
		}
		if err := m.wake(); err != nil { // the slot waker: copies a lost reply left unappended (Cluster)
			return err
		}
		if err := m.deliver(round, false); err != nil {
			return err
		}
		if err := m.check(); err != nil {
			return err
		}
	}
	for _, ev := range m.events {
		if m.ran[ev] != 1 {
			return m.fail(propSlotsOnce, "event %s ran %d times to its end (events %d, ran %v)", ev, m.ran[ev], len(m.events), m.ran)
		}
	}
	return nil
}

// allRead reports whether both streams' entries were all read and acked.
func (m *slotsModel) allRead() (bool, error) {
	for _, stream := range m.streams {
		info, err := m.direct.XInfoGroups(m.ctx, stream).Result()
		if err != nil {
			return false, err
		}
		if len(info) == 0 || info[0].Lag != 0 || info[0].Pending != 0 {
			return false, nil
		}
	}
	return true, nil
}

// handedLeft reports whether a slot handed to a waiter still waits for its copy to be
// appended (Cluster: a lost reply), which the slot waker appends.
func (m *slotsModel) handedLeft() bool {
	for key := range m.limits {
		if n, _ := m.direct.HLen(m.ctx, m.l.SlotKeys(key).Handed).Result(); n > 0 {
			return true
		}
	}
	return false
}

func genSlotSteps(r *rand.Rand, n int) []mStep {
	kinds := []string{"new", "new", "new", "deliver", "deliver", "deliver", "end", "end", "crash", "between", "expire", "wake"}
	steps := make([]mStep, n)
	for i := range steps {
		steps[i] = mStep{Kind: kinds[r.IntN(len(kinds))], A: r.IntN(100), B: r.IntN(100)}
	}
	return steps
}

func (e *modelEnv) runSlots(format KeyFormat, steps []mStep) error {
	ns := redistest.Namespace()
	defer redistest.DeleteNamespace(context.Background(), e.direct, ns)
	l, err := New(e.client, Options{Scope: ns, TTL: time.Minute, Format: format})
	if err != nil {
		return err
	}
	m := &slotsModel{ctx: context.Background(), direct: e.direct, proxy: e.proxy, l: l, ns: ns,
		streams: [2]string{"{" + ns + "s}", "{" + ns + "s}:todo"}, limits: map[string]int64{}, ran: map[string]int{}}
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

func (e *modelEnv) checkSlotSeeds(from, n int) (int, error) {
	for seed := from; seed < from+n; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 3738))
		format := KeysCompat
		if r.IntN(2) == 1 {
			format = KeysCluster
		}
		if err := e.runSlots(format, genSlotSteps(r, 80)); err != nil {
			return seed, fmt.Errorf("format %d: %w", format, err)
		}
	}
	return 0, nil
}

// TestModelLeaseSlots runs seeded random sequences against the concurrency limits
// (MODEL_SEEDS=N, MODEL_SEED=S as TestModelLease).
func TestModelLeaseSlots(t *testing.T) {
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 24)
	start := time.Now()
	if seed, err := e.checkSlotSeeds(from, n); err != nil {
		t.Fatalf("slots model checker: seed %d fails: %v", seed, err)
	}
	t.Logf("%d seeds of 80 steps in %s", n, time.Since(start).Round(time.Millisecond))
}

// TestModelLeaseSlotsPlanted plants a lost wake-up (a free that does not hand its slot
// on; a take that parks beside a slot freed by expiry and hands nothing out) and an
// over-grant (a take that counts one slot too many free), and requires the checker to
// catch each.
func TestModelLeaseSlotsPlanted(t *testing.T) {
	cases := []struct {
		name     string
		src      *string
		old, new string
		prop     string
	}{
		{"free-never-hands-on", &slotsFreeLua, "local handed = slots_promote(k, o, now, nil, nil)", "local handed = {}", propSlotsWake},
		{"park-beside-a-free-slot", &slotsTakeLua, "local handed, took = slots_promote(k, o, now, o.lid, o.token)", "local handed, took = {}, false", propSlotsWake},
		{"over-grant", &slotsTakeLua, "if used < tonumber(o.limit) and slots_waiting(k) == 0 then", "if used <= tonumber(o.limit) and slots_waiting(k) == 0 then", propSlotsBound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			planted := plantLua(t, *c.src, c.old, c.new)
			saved, savedTake, savedFree := *c.src, slotsTakeScript, slotsFreeScript
			*c.src = planted
			slotsTakeScript = newScript(leaseLua + slotsLua + slotsTakeLua)
			slotsFreeScript = newScript(leaseLua + slotsLua + slotsFreeLua)
			t.Cleanup(func() { *c.src, slotsTakeScript, slotsFreeScript = saved, savedTake, savedFree })
			e := newModelEnv(t)
			seed, err := e.checkSlotSeeds(1, 48)
			requireCaught(t, "the model checker did not catch the planted defect", seed, err, c.prop)
		})
	}
}
