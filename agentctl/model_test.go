package agentctl_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The model's properties.
const (
	propNoOverspend   = "NoOverspend"         // counted spend + live reservations <= budget; real spend <= budget + lost calls
	propCountedOnce   = "CountedOnce"         // the ledger counts each accepted report once, retries included
	propStaleRefused  = "StaleRefused"        // a run without its lease gets stale_fence, whatever it asks
	propNoStaleCkpt   = "NoStaleCheckpoint"   // the saved checkpoint is the last one its lease's holder saved
	propRetrySame     = "RetrySameAnswer"     // a request retried after a lost reply gets its first answer
	propDeadFreedOnce = "DeadReservationFree" // a dead or ended run's reservation no longer counts
	propParkedKept    = "ParkedNotLost"       // a parked request is parked still or published, whatever crashed
	propParkedOnce    = "ParkedPublishedOnce" // a parked request is published at most once, resumes repeated
)

// mRun is one run of the model: its lease, its sequence, its open reservation and
// whether it holds a call's cost it has not reported.
type mRun struct {
	le       *lease.Lease
	run      agentctl.Run
	seq      int64
	reserved int64 // the model's open reservation of the run
	calling  bool  // made a call, not reported yet
	current  bool  // holds its lease (not superseded, crashed or ended)
}

type mWorld struct {
	t       *testing.T
	w       *world
	rng     *rand.Rand
	issue   string
	budget  int64
	step    int64
	runs    []*mRun
	holder  map[string]*mRun // agent -> current run
	counted int64            // the model's counted spend
	real    int64            // what the calls cost
	lost    int64            // calls whose report can never be counted (crash, stale)
	ckFence int64
	ckData  string
	trace   []string
	// resume publishes the parked requests again (the ledger's ResumeParked, or a
	// planted defect), with a crash at the point crash names.
	resume resumeFunc
	// owed: agent -> the id of its newest parked request, until it is seen published.
	owed    map[string]string
	planted bool // a failure panics with a modelFailure instead of failing the test
}

// modelFailure is a property the model found broken (planted runs).
type modelFailure struct{ prop, msg string }

// Crash points of a resume.
const (
	crashNone          = iota
	crashBeforePublish // the process dies before the publish reaches Redis
	crashAfterPublish  // the publish went through; the process dies before anything else
)

// resumeFunc resumes issue's parked requests, publishing each with publish; crash says
// where it dies.
type resumeFunc func(ctx context.Context, m *mWorld, crash int) error

// TestModelLedger runs seeded random sequences of reservations, calls, usage reports
// (some replies lost and retried), checkpoints, crashes between and during calls, and
// supersedes, on two agents of one issue, and checks the properties after every step.
// MODEL_SEED picks one seed, MODEL_SEEDS how many (default 25).
func TestModelLedger(t *testing.T) {
	from, n := redistest.ModelSeeds(t, 25)
	for seed := from; seed < from+n; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runModel(t, seed, resumeLedger, false) })
	}
}

// runModel runs one seed of the model with resume; planted, it returns the first
// property broken instead of failing the test.
func runModel(t *testing.T, seed int, resume resumeFunc, planted bool) (failure *modelFailure) {
	m := &mWorld{t: t, w: newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute), rng: rand.New(rand.NewPCG(uint64(seed), 39)),
		issue: "RHEL-39", budget: 1_000_000, step: 150_000, holder: map[string]*mRun{},
		resume: resume, owed: map[string]string{}, planted: planted}
	if planted {
		defer func() {
			if f, ok := recover().(modelFailure); ok {
				failure = &f
			}
		}()
	}
	for i := range 60 {
		m.stepOnce(i)
		m.check()
	}
	return nil
}

func (m *mWorld) fail(prop, format string, a ...any) {
	m.t.Helper()
	if m.planted {
		panic(modelFailure{prop: prop, msg: fmt.Sprintf(format, a...)})
	}
	m.t.Fatalf("%s: %s\ntrace:\n%s", prop, fmt.Sprintf(format, a...), strings.Join(m.trace, "\n"))
}

func (m *mWorld) pick() *mRun {
	if len(m.runs) == 0 {
		return nil
	}
	return m.runs[m.rng.IntN(len(m.runs))]
}

func (m *mWorld) stepOnce(i int) {
	agent := []string{"triage", "rebase"}[m.rng.IntN(2)]
	r := m.pick()
	switch op := m.rng.IntN(10); {
	case op == 8:
		m.park(agent, i)
	case op == 9:
		m.resumeParked(i)
	case op == 0 || r == nil:
		m.start(agent)
	case op == 1:
		m.trace = append(m.trace, fmt.Sprintf("%d supersede %s", i, agent))
		if h := m.holder[agent]; h != nil {
			if _, err := m.w.locker.ForceRelease(context.Background(), agent, m.issue); err != nil {
				m.t.Fatal(err)
			}
			h.current = false
			if h.calling {
				// Its call was charged, and its report can only be refused (stale):
				// lost from now on, as at a crash (its reservation no longer counts).
				m.lost += h.reserved
			}
			delete(m.holder, agent)
			m.start(agent)
		}
	case op == 2:
		m.trace = append(m.trace, fmt.Sprintf("%d crash %s/%d (calling %v)", i, r.run.Agent, r.run.Fence, r.calling))
		m.crash(r)
	case op == 3:
		m.checkpoint(r, i)
	case op == 4 || op == 5:
		m.reserve(r, i)
	default:
		m.callAndReport(r, i)
	}
}

func (m *mWorld) start(agent string) {
	if m.holder[agent] != nil {
		return
	}
	le, err := m.w.locker.Acquire(context.Background(), agent, m.issue, lease.AcquireOptions{})
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { _, _ = le.Release(context.Background()) })
	r := &mRun{le: le, run: agentctl.RunOf(le), current: true}
	m.runs = append(m.runs, r)
	m.holder[agent] = r
	m.trace = append(m.trace, fmt.Sprintf("start %s/%d", agent, r.run.Fence))
}

// crash: the run's process dies; its lease expires (its keys gone, as at the TTL). A
// call in flight was charged and is never reported.
func (m *mWorld) crash(r *mRun) {
	if !r.current {
		// Superseded: its keys are the new holder's now, and a call it had in flight
		// was counted lost then.
		r.calling, r.reserved = false, 0
		return
	}
	ctx := context.Background()
	if err := m.w.rdb.Del(ctx, r.run.LockKey, r.run.InfoKey).Err(); err != nil {
		m.t.Fatal(err)
	}
	if r.calling {
		m.lost += r.reserved
	}
	r.current, r.calling, r.reserved = false, false, 0
	delete(m.holder, r.run.Agent)
}

// ask runs one request, and with a lost reply runs it again with the same seq: both
// answers must agree.
func (m *mWorld) ask(r *mRun, do func(seq int64) string) string {
	r.seq++
	first := do(r.seq)
	if m.rng.IntN(3) == 0 {
		if again := do(r.seq); again != first {
			m.fail(propRetrySame, "%s/%d seq %d answered %s, then %s", r.run.Agent, r.run.Fence, r.seq, first, again)
		}
	}
	return first
}

func (m *mWorld) reserve(r *mRun, i int) {
	st := m.ask(r, func(seq int64) string {
		g, err := m.w.ledger.Reserve(context.Background(), r.run, seq, m.step)
		if err != nil {
			m.t.Fatal(err)
		}
		return g.Status
	})
	m.trace = append(m.trace, fmt.Sprintf("%d reserve %s/%d: %s", i, r.run.Agent, r.run.Fence, st))
	if !r.current {
		if st != agentctl.StatusStaleFence {
			m.fail(propStaleRefused, "a run without its lease reserved: %s", st)
		}
		return
	}
	if st == agentctl.StatusGranted {
		r.reserved += m.step
	}
	// A denial must be the budget's: a dead, superseded or ended run's reservation
	// no longer counts against it.
	if st == agentctl.StatusDenied && m.counted+m.modelLive()+m.step <= m.budget {
		m.fail(propDeadFreedOnce, "denied with counted %d + live %d + %d within the budget %d", m.counted, m.modelLive(), m.step, m.budget)
	}
}

// modelLive is the open reservations of the runs holding their lease.
func (m *mWorld) modelLive() int64 {
	var n int64
	for _, r := range m.runs {
		if r.current {
			n += r.reserved
		}
	}
	return n
}

// callAndReport: a run with a granted reservation makes its call (charged), then
// (unless the dice say it is still calling) reports it.
func (m *mWorld) callAndReport(r *mRun, i int) {
	if r.reserved > 0 && !r.calling && r.current {
		r.calling = true
		m.real += r.reserved
		m.trace = append(m.trace, fmt.Sprintf("%d call %s/%d: %d", i, r.run.Agent, r.run.Fence, r.reserved))
		if m.rng.IntN(2) == 0 {
			return // the report comes later, or never (a crash)
		}
	}
	if !r.calling {
		return
	}
	cost := r.reserved
	st := m.ask(r, func(seq int64) string {
		st, _, err := m.w.ledger.Report(context.Background(), r.run, seq, agentctl.Usage{Model: "m", Micro: cost})
		if err != nil {
			m.t.Fatal(err)
		}
		return st
	})
	m.trace = append(m.trace, fmt.Sprintf("%d report %s/%d %d: %s", i, r.run.Agent, r.run.Fence, cost, st))
	r.calling = false
	if !r.current {
		if st != agentctl.StatusStaleFence {
			m.fail(propStaleRefused, "a run without its lease reported: %s", st)
		}
		r.reserved = 0 // its call was counted lost when it was superseded
		return
	}
	m.counted += cost
	r.reserved = 0
}

func (m *mWorld) checkpoint(r *mRun, i int) {
	data := fmt.Sprintf(`{"step":%d}`, i)
	st := m.ask(r, func(seq int64) string {
		st, err := m.w.ledger.SaveCheckpoint(context.Background(), r.run, seq, []byte(data))
		if err != nil {
			m.t.Fatal(err)
		}
		return st
	})
	m.trace = append(m.trace, fmt.Sprintf("%d checkpoint %s/%d: %s", i, r.run.Agent, r.run.Fence, st))
	switch {
	case !r.current && st != agentctl.StatusStaleFence:
		m.fail(propNoStaleCkpt, "a run without its lease saved a checkpoint: %s", st)
	case r.current && r.run.Agent == "rebase" && st == agentctl.StatusSaved:
		m.ckFence, m.ckData = r.run.Fence, data
	}
}

func (m *mWorld) check() {
	ctx := context.Background()
	c, err := m.w.ledger.Costs(ctx, m.issue)
	if err != nil {
		m.t.Fatal(err)
	}
	if c.Micro != m.counted {
		m.fail(propCountedOnce, "the ledger counts %d, the model %d", c.Micro, m.counted)
	}
	// Live reservations as Redis holds them, each checked against its lease.
	res, _ := m.w.rdb.HGetAll(ctx, m.w.ns+"ctl:{"+m.issue+"}:res").Result()
	var live, modelLive int64
	for _, v := range res {
		var amount int64
		var lock, token string
		_, _ = fmt.Sscanf(v, "%d %s %s", &amount, &lock, &token)
		if m.w.rdb.Get(ctx, lock).Val() == token {
			live += amount
		}
	}
	modelLive = m.modelLive()
	if live != modelLive {
		m.fail(propDeadFreedOnce, "live reservations %d in Redis, %d in the model", live, modelLive)
	}
	if c.Micro+live > m.budget {
		m.fail(propNoOverspend, "counted %d + reserved %d > budget %d", c.Micro, live, m.budget)
	}
	if m.real > m.budget+m.lost {
		m.fail(propNoOverspend, "real spend %d > budget %d + lost calls %d", m.real, m.budget, m.lost)
	}
	m.checkParked(ctx)
	ck, ok, err := m.w.ledger.LastCheckpoint(ctx, "rebase", m.issue)
	if err != nil || ok != (m.ckData != "") || ok && (string(ck.Data) != m.ckData || ck.Fence != m.ckFence) {
		m.fail(propNoStaleCkpt, "checkpoint %s fence %d (%v %v), the model %s fence %d", ck.Data, ck.Fence, ok, err, m.ckData, m.ckFence)
	}
}
