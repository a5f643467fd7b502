package lease

// The batch step of the lease's model checker (model_test.go): Locker.HandoffBatch ends
// up to three running runs (ran) and takes up to three waiting events' leases ahead in
// one script (handoff_batch.lua). Each end is booked as the model's release books one,
// each next as its acquire does, after the ends (the script releases first). It runs
// only where the middleware batches: standalone keys, scope agent, Batchable leases
// ending, nexts of the plain acquire's policies (drop, delay), one per key. Each end's
// run is dated as ended at the start of a step since it began, so that the release's
// date (the server's clock minus the time since then) is checked against that step.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// batchStats counts the batch steps' calls, ends, lost replies (the proxy's cuts) and
// nexts' outcomes, to show the step is not vacuous.
type batchStats struct {
	calls, ends int
	stale       int // ends of stale runs
	taken       int // of those, ends whose key another run held
	lost        int64
	nexts       map[string]int
}

func (b *batchStats) String() string {
	return fmt.Sprintf("%d batches: %d ends (%d stale, %d of their keys held by another), %d lost replies, nexts %v",
		b.calls, b.ends, b.stale, b.taken, b.lost, b.nexts)
}

func (b *batchStats) note(ends int, cuts int64) {
	b.calls++
	b.ends += ends
	b.lost += cuts
}

func (b *batchStats) outcome(got string) {
	if b.nexts == nil {
		b.nexts = map[string]int{}
	}
	b.nexts[got]++
}

// modelGroup is the consumer group the batch step reads the stream with and acks in.
const modelGroup = "g"

// batch ends runs and takes leases ahead in one HandoffBatch: s.A picks the ends, s.B
// the nexts, s.C whether its reply is lost and when each run ended.
func (m *modelRun) batch(s mStep) error {
	if m.cfg.Format == KeysCluster || m.cfg.Scope != "agent" {
		return nil
	}
	ends := m.batchEnds(s)
	if err := m.takeStaleKeys(ends, s); err != nil {
		return err
	}
	nexts := m.batchNexts(s)
	if len(ends)+len(nexts) == 0 {
		return nil
	}
	be, err := m.batchOf(ends, s.C/4)
	if err != nil {
		return err
	}
	bn := make([]Next, len(nexts))
	for i, ev := range nexts {
		bn[i] = Next{Agent: ev.agent, Key: ev.issue, Options: m.options(ev)}
	}
	if s.C%4 == 0 {
		m.loseNext(batchKey(ends, nexts))
	}
	before := make([]string, len(ends))
	for i, r := range ends {
		before[i] = m.doneRecord(r)
	}
	sent, cuts := time.Now(), m.proxy.Cuts()
	pending, err := m.l.HandoffBatch(m.ctx, be, bn)
	if err != nil {
		return err
	}
	m.batches.note(len(ends), m.proxy.Cuts()-cuts)
	if err := m.batchEnded(be, ends, before, sent, time.Now()); err != nil {
		return err
	}
	for i, ev := range nexts {
		allowed := m.expect(ev) // after the ends' releases
		le, err := pending[i].Take(m.ctx)
		m.batches.outcome(outcome(le, err))
		if err := m.acquired(ev, allowed, le, err); err != nil {
			return err
		}
	}
	return m.checkAcked(ends, nexts)
}

// batchOf is the ends' part of a batch: each run's entry, read into the group (pending),
// and when its run ended (c picks the step); the run has read its mailbox.
func (m *modelRun) batchOf(ends []*mRun, c int) ([]End, error) {
	if err := m.readGroup(); err != nil {
		return nil, err
	}
	be := make([]End, len(ends))
	for i, r := range ends {
		if err := m.readMailbox(r, "ran"); err != nil {
			return nil, err
		}
		be[i] = End{Lease: r.le, Entry: Entry{Stream: m.stream, Group: modelGroup, ID: r.ev.id}, EndedAt: m.endedAt(r, c)}
	}
	return be, nil
}

// batchEnds picks up to three runs whose lease can end in a batch: running, or stale
// by the clock or by force (the worker has not noticed; the key may be another's now).
func (m *modelRun) batchEnds(s mStep) []*mRun {
	var cands, stale []*mRun
	for _, r := range m.runsIn(runRunning, runStale) {
		switch {
		case !r.le.Batchable():
		case r.state == runRunning:
			cands = append(cands, r)
		case r.why != "superseded":
			stale = append(stale, r)
		}
	}
	// A stale run is rare: when there is one, it ends first (its release must leave the
	// key's new holder be), with up to two running ones.
	var out []*mRun
	if len(stale) > 0 {
		out = append(out, stale[s.A%len(stale)])
	}
	n := min(1+s.A%3, len(cands)+len(out))
	for i := 0; len(out) < n; i++ {
		out = append(out, cands[(s.A/3+i)%len(cands)])
	}
	return out
}

// takeStaleKeys: now and then (s.C), an event of a stale end's key, free now, takes
// that key before the batch is sent, as another worker would once the stale lease
// expired: the batch's release of the stale run must leave it be.
func (m *modelRun) takeStaleKeys(ends []*mRun, s mStep) error {
	if s.C%2 != 0 {
		return nil
	}
	for _, r := range ends {
		if r.state != runStale || m.key(ownKey(r.ev)).holder != nil {
			continue
		}
		for i, ev := range m.inbox {
			if ownKey(ev) == ownKey(r.ev) {
				m.inbox = append(m.inbox[:i], m.inbox[i+1:]...)
				if err := m.acquire(ev); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

// batchNexts takes up to three events out of the inbox whose policy is the plain
// acquire's, no two of one key (the middleware takes one entry of an issue ahead).
func (m *modelRun) batchNexts(s mStep) []*mEvent {
	var out []*mEvent
	seen := map[string]bool{}
	for i := 0; i < len(m.inbox) && len(out) < s.B%4; i++ {
		ev := m.inbox[(s.B/4+i)%len(m.inbox)]
		if p := m.cfg.policy(ev.typ); (p == "drop" || p == "delay") && !seen[ownKey(ev)] {
			seen[ownKey(ev)] = true
			out = append(out, ev)
		}
	}
	for _, ev := range out {
		for i, x := range m.inbox {
			if x == ev {
				m.inbox = append(m.inbox[:i], m.inbox[i+1:]...)
				break
			}
		}
	}
	return out
}

// batchKey is an event whose key the batch's script names (a lost reply's target).
func batchKey(ends []*mRun, nexts []*mEvent) *mEvent {
	if len(ends) > 0 {
		return ends[0].ev
	}
	return nexts[0]
}

// endedAt is when r's run ended: the start of one of the steps since it was acquired.
func (m *modelRun) endedAt(r *mRun, c int) time.Time {
	return m.stepAt[r.from+1+c%(m.step-r.from)]
}

// readGroup delivers every entry of the stream not yet read to the model's consumer
// group, so that a batch's ends have entries pending to ack.
func (m *modelRun) readGroup() error {
	if !m.grouped {
		if err := m.direct.XGroupCreateMkStream(m.ctx, m.stream, modelGroup, "0").Err(); err != nil {
			return err
		}
		m.grouped = true
	}
	err := m.direct.XReadGroup(m.ctx, &redis.XReadGroupArgs{Group: modelGroup, Consumer: "c",
		Streams: []string{m.stream, ">"}, Block: -1}).Err()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// batchEnded checks each end's done record and books its release. The record names
// the end's entry and is dated by when its run ended: no earlier than EndedAt, and
// before hi, the latest the server's clock (read by the script after sent) minus the
// time since EndedAt (as the worker measured it before sending, capped) can be.
//
// A stale end's release finds its key not its own: it writes no done record, leaves
// the key's new holder alone and publishes a queued follow-up only when nobody holds
// the key; its run ended as ran (its entry is acked).
func (m *modelRun) batchEnded(be []End, ends []*mRun, before []string, sent, done time.Time) error {
	for i, r := range ends {
		if r.state == runStale {
			if err := m.batchEndedStale(r, before[i], ends); err != nil {
				return err
			}
			continue
		}
		ago := min(sent.Sub(be[i].EndedAt), maxBatchAgo)
		lo, hi := be[i].EndedAt.UnixMilli()-2, done.UnixMilli()-ago.Milliseconds()+1
		rec := m.doneRecord(r)
		f := append(strings.Fields(rec), "", "")
		ms, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || f[1] != r.ev.id || ms < lo || ms >= hi {
			return m.fail(propBatch, "event %d: its batch's release recorded %q; want its entry %s dated in [%d, %d) (its run ended at %d)",
				r.ev.n, rec, r.ev.id, lo, hi, be[i].EndedAt.UnixMilli())
		}
		if err := m.released(r, "ran", ""); err != nil {
			return err
		}
		k := m.key(ownKey(r.ev))
		k.lastRunLo, k.lastRunHi = lo, hi
	}
	return nil
}

// batchEndedStale books the batch's end of a stale run (batchEnded). Its key's done
// record is the other end's when the batch also ends the run that holds that key now.
func (m *modelRun) batchEndedStale(r *mRun, before string, ends []*mRun) error {
	mine := true
	for _, o := range ends {
		if o != r && ownKey(o.ev) == ownKey(r.ev) {
			mine = false
		}
	}
	if after := m.doneRecord(r); mine && after != before {
		return m.fail(propBatch, "event %d: its batch's release of a key not its own wrote the done record %q (was %q)", r.ev.n, after, before)
	}
	m.batches.stale++
	if k := m.key(ownKey(r.ev)); k.holder == nil {
		m.mayDrain(k)
	} else {
		m.batches.taken++
	}
	r.released, r.state = true, runDone
	m.removeRun(r)
	return m.terminal(r.ev, "ran")
}

// checkAcked: a batch acks each end's entry, and no next's.
func (m *modelRun) checkAcked(ends []*mRun, nexts []*mEvent) error {
	ps, err := m.direct.XPendingExt(m.ctx, &redis.XPendingExtArgs{Stream: m.stream, Group: modelGroup,
		Start: "-", End: "+", Count: 1 << 20}).Result()
	if err != nil {
		return err
	}
	pending := map[string]bool{}
	for _, p := range ps {
		pending[p.ID] = true
	}
	for _, r := range ends {
		if pending[r.ev.id] {
			return m.fail(propBatch, "event %d: its batch did not ack its entry %s", r.ev.n, r.ev.id)
		}
	}
	for _, ev := range nexts {
		if !pending[ev.id] {
			return m.fail(propBatch, "event %d: its batch acked the entry %s it took a lease ahead for", ev.n, ev.id)
		}
	}
	return nil
}

// batchKinds are TestModelLease's steps and the batch step.
var batchKinds = append(slices.Clip(stepKinds), stepKind{"batch", 3})

// genBatchConfig is a configuration the middleware batches under: standalone keys,
// scope agent, a default policy of the plain acquire's and now and then a type that
// supersedes (its leases end in batches, its events are not taken ahead), coalesces or
// delivers (then every lease but a supersede one drains and ends on its own path; nexts
// are still taken ahead).
//
// One in two is Mixed (a second worker, whose rule coalesces, queues follow-ups
// behind the leases of the first, which end in batches), with a coalescing type.
func genBatchConfig(r *rand.Rand) mConfig {
	c := mConfig{Format: KeysCompat, Scope: "agent", Table: map[string]string{"*": []string{"drop", "delay"}[r.IntN(2)]}}
	for _, t := range modelTypes[:r.IntN(3)] {
		c.Table[t] = []string{"drop", "delay", "delay", "supersede", "coalesce", "deliver"}[r.IntN(6)]
	}
	if r.IntN(2) == 0 {
		c.Mixed = true
		c.Table[modelTypes[0]] = "coalesce"
	}
	return c
}

// TestModelLeaseBatch runs TestModelLease's checker on configurations that batch
// (MODEL_SEEDS=N for more; MODEL_SEED=S runs seed S alone).
func TestModelLeaseBatch(t *testing.T) {
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 16)
	start := time.Now()
	e.checkSeeds(t, from, n, 60, genBatchConfig, batchKinds)
	t.Logf("%d seeds of 60 steps in %s; %s", n, time.Since(start).Round(time.Millisecond), &e.batches)
}
