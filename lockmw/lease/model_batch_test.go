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
)

// batchStats counts the batch steps' calls, ends, lost replies (the proxy's cuts) and
// nexts' outcomes, to show the step is not vacuous.
type batchStats struct {
	calls, ends int
	lost        int64
	nexts       map[string]int
}

func (b *batchStats) String() string {
	return fmt.Sprintf("%d batches: %d ends, %d lost replies, nexts %v", b.calls, b.ends, b.lost, b.nexts)
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
	ends, nexts := m.batchEnds(s), m.batchNexts(s)
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
	sent, cuts := time.Now(), m.proxy.Cuts()
	pending, err := m.l.HandoffBatch(m.ctx, be, bn)
	if err != nil {
		return err
	}
	m.batches.note(len(ends), m.proxy.Cuts()-cuts)
	if err := m.batchEnded(be, ends, sent, time.Now()); err != nil {
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

// batchEnds picks up to three running runs whose lease can end in a batch.
func (m *modelRun) batchEnds(s mStep) []*mRun {
	var cands []*mRun
	for _, r := range m.runsIn(runRunning) {
		if r.le.Batchable() {
			cands = append(cands, r)
		}
	}
	n := min(1+s.A%3, len(cands))
	out := make([]*mRun, n)
	for i := range out {
		out[i] = cands[(s.A/3+i)%len(cands)]
	}
	return out
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
func (m *modelRun) batchEnded(be []End, ends []*mRun, sent, done time.Time) error {
	for i, r := range ends {
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
func genBatchConfig(r *rand.Rand) mConfig {
	c := mConfig{Format: KeysCompat, Scope: "agent", Table: map[string]string{"*": []string{"drop", "delay"}[r.IntN(2)]}}
	for _, t := range modelTypes[:r.IntN(3)] {
		c.Table[t] = []string{"drop", "delay", "delay", "supersede", "coalesce", "deliver"}[r.IntN(6)]
	}
	return c
}

// TestModelLeaseBatch runs TestModelLease's checker on configurations that batch
// (MODEL_SEEDS=N for more; MODEL_SEED=S runs seed S alone).
func TestModelLeaseBatch(t *testing.T) {
	e := newModelEnv(t)
	from, n := modelRange(16)
	start := time.Now()
	e.checkSeeds(t, from, n, 60, genBatchConfig, batchKinds)
	t.Logf("%d seeds of 60 steps in %s; %s", n, time.Since(start).Round(time.Millisecond), &e.batches)
}
