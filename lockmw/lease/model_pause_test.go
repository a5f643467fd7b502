package lease

// The pause's model checker (issue 38, item 5): seeded random sequences against the
// real Redis, on both key formats, of events arriving on two streams (two issues, two
// values of a field), delivered to workers that take the lease and then check the
// pauses (the middleware's order), runs that finish or fail (redelivered), pauses and
// resumes of three scopes (an agent, an issue, a field value), with the faults between
// the calls: a worker that dies between parking an event and acking it (its entry is
// claimed later), a resume that dies between an append and the step that takes
// the event out of the line (run again later), replies lost (go-redis sends the script
// again). On standalone Redis, workers also take leases ahead in batches
// (HandoffBatch with the pauses: the check made in the batch's script) and start their
// runs some steps later, pauses written in between; a worker that dies between a park
// and its own ack (ParkEntry.Ack false) leaves a parked entry to be redelivered, met
// by the record of parked entries (seen). After every step: no run starts in a scope
// the model knows paused (while a resume runs, only the copies it published start),
// except a run whose check the batch made before that pause was written, and which the
// pause's listing of live leases named; and each resume appends what it republishes in
// stream order. Once every scope is resumed and everything delivered:
// every event ran to its end exactly once, nothing is parked or pending. The planted
// defects (TestModelLeasePausePlanted) show that the checker catches a broken park or
// resume.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/streamid"
)

// Properties of the pause.
const (
	propPauseNoRun = "PauseNoRun"    // no run starts in a paused scope
	propPauseOnce  = "PauseRunsOnce" // every event runs to its end exactly once when settled
	propPauseOrder = "PauseOrder"    // a resume republishes in stream order
	propPauseLeft  = "PauseLeft"     // nothing parked or pending once settled
)

var pauseScopes = []string{"field:c=a", "issue:P-1", "agent:a"}

type pauseRun struct {
	le     *Lease
	msg    redis.XMessage
	stream string
	lid    string
	isCopy bool
}

type pauseMsg struct {
	stream string
	msg    redis.XMessage
}

// pauseCov counts the batch paths the pause model took, over its seeds: runs started
// on their batch's check, those past a pause written after the batch (and named by
// its listing), leases taken ahead not checked by the batch (a pause existed, or the
// entry was parked), and among those, redelivered entries that were parked already.
type pauseCov struct {
	batchChecked, pastLaterPause, notChecked, parkedRepeat int
}

// pauseAhead is a lease a batch took ahead, its run not started yet.
type pauseAhead struct {
	p     *Pending
	in    pauseMsg
	epoch int             // when the batch ran (pauseModel.epoch)
	named map[string]bool // the pauses written since whose listing named its lease
}

type pauseModel struct {
	ctx     context.Context
	direct  *redis.Client
	proxy   *redistest.LossyProxy
	l       *Locker
	p       *Pauses
	streams []string
	inbox   []pauseMsg
	runs    []*pauseRun
	state   map[string]string // scope -> paused | resuming
	done    map[string]int    // stream lid -> runs ended done
	known   map[string]bool   // stream lid of every event
	cuts    int64             // the proxy's cuts once the armed lost reply is met
	cov     *pauseCov
	dead    []pauseMsg     // entries of workers that died, claimed later (claim)
	ahead   []*pauseAhead  // leases taken ahead by batches (standalone)
	epoch   int            // counts batches and pause writes, in order
	since   map[string]int // scope -> the epoch its pause was written (paused, resuming)
}

func (m *pauseModel) fail(prop, format string, args ...any) error {
	return fmt.Errorf("property %s: %s", prop, fmt.Sprintf(format, args...))
}

func (m *pauseModel) target(msg redis.XMessage) PauseTarget {
	c, _ := msg.Values["c"].(string)
	i, _ := msg.Values["i"].(string)
	return PauseTarget{Agent: "a", Issue: i, Payload: []byte(`{"c":"` + c + `"}`)}
}

func (m *pauseModel) read() error {
	for _, s := range m.streams {
		res, err := m.direct.XReadGroup(m.ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{s, ">"}, Count: 100, Block: -1}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return err
		}
		for _, msg := range res[0].Messages {
			m.inbox = append(m.inbox, pauseMsg{stream: s, msg: msg})
		}
	}
	return nil
}

func (m *pauseModel) newEvent(a int) error {
	s := m.streams[a%2]
	c := []string{"a", "b"}[(a/2)%2]
	i := []string{"P-1", "P-2"}[(a/4)%2]
	id, err := m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"c": c, "i": i, "pf": ""}}).Result()
	m.known[s+" "+id] = true
	return err
}

// deliver hands inbox[a] to a worker: the lease, then the pause check.
func (m *pauseModel) deliver(a int, crashBeforeAck bool) error {
	if len(m.inbox) == 0 {
		return nil
	}
	i := a % len(m.inbox)
	in := m.inbox[i]
	m.inbox = slices.Delete(m.inbox, i, i+1)
	msg := in.msg
	_, _, issue := m.lid(msg)
	le, err := m.l.Acquire(m.ctx, "a", issue, AcquireOptions{MessageID: msg.ID})
	var locked *LockedError
	if errors.As(err, &locked) {
		m.inbox = append(m.inbox, in) // redelivered later
		return nil
	}
	if err != nil {
		return err
	}
	return m.checkRun(in, le, crashBeforeAck)
}

// checkRun is a worker's pause check of in under its lease le, then its run or its park
// (a worker that dies before its ack acks nothing: on standalone, its park then leaves
// the ack to it).
func (m *pauseModel) checkRun(in pauseMsg, le *Lease, crashBeforeAck bool) error {
	msg := in.msg
	lid, isCopy, issue := m.lid(msg)
	t := m.target(msg)
	res, err := m.p.Check(m.ctx, t, ParkEntry{Stream: in.stream, Group: "g", ID: msg.ID, LineID: lid, Copy: isCopy, Issue: issue, Ack: !crashBeforeAck,
		Fields: func() (map[string]any, error) {
			f := map[string]any{}
			for k, v := range msg.Values {
				f[k] = v
			}
			f["pf"] = lid
			return f, nil
		}})
	if err != nil {
		le.stopHeartbeat()
		return err
	}
	if res.Verdict == Run {
		return m.start(in, le, nil)
	}
	if err := le.Park(m.ctx); err != nil {
		return err
	}
	if res.Acked {
		return nil
	}
	if crashBeforeAck {
		m.dead = append(m.dead, in) // the worker died: its entry is claimed later
		return nil
	}
	return m.direct.XAck(m.ctx, in.stream, "g", msg.ID).Err()
}

// lid is the line id of msg, whether it is a copy a resume appended, and its issue.
func (m *pauseModel) lid(msg redis.XMessage) (string, bool, string) {
	lid, _ := msg.Values["pf"].(string)
	isCopy := lid != ""
	if !isCopy {
		lid = msg.ID
	}
	issue, _ := msg.Values["i"].(string)
	return lid, isCopy, issue
}

// start starts the run of in under le, its check passed: by Check now, or (ah) in the
// batch that took le ahead. A scope the model knows paused holds it back, unless the
// batch's check came before that pause was written and the pause's listing named le.
func (m *pauseModel) start(in pauseMsg, le *Lease, ah *pauseAhead) error {
	msg := in.msg
	lid, isCopy, _ := m.lid(msg)
	t := m.target(msg)
	for _, s := range pauseScopes {
		sc, _ := m.l.ParsePauseScope(s)
		if !sc.Matches(t) {
			continue
		}
		st := m.state[s]
		if st != pauseStatePaused && (st != pauseStateResuming || isCopy) {
			continue
		}
		if ah != nil && m.since[s] > ah.epoch && ah.named[s] {
			m.cov.pastLaterPause++
			continue // past its check when the pause was written, and listed by it
		}
		le.stopHeartbeat()
		how := "checked now"
		if ah != nil {
			how = fmt.Sprintf("checked in its batch at %d, %s written at %d, named %v", ah.epoch, s, m.since[s], ah.named[s])
		}
		return m.fail(propPauseNoRun, "%s %s (lid %s, copy %v, values %v) starts while %s is %s (%s; registry %v)", in.stream, msg.ID, lid, isCopy, msg.Values, s, st,
			how, m.direct.HGetAll(m.ctx, m.p.keys.Reg).Val())
	}
	m.runs = append(m.runs, &pauseRun{le: le, msg: msg, stream: in.stream, lid: lid, isCopy: isCopy})
	return nil
}

// batch takes the leases of up to three inbox events ahead in one HandoffBatch, their
// pause checks in its script (standalone; on Cluster, a delivery instead).
func (m *pauseModel) batch(a int) error {
	if m.l.opts.Format == KeysCluster || len(m.inbox) == 0 {
		return m.deliver(a, false)
	}
	i := a % len(m.inbox)
	n := min(1+a%3, len(m.inbox)-i)
	ins := slices.Clone(m.inbox[i : i+n])
	m.inbox = slices.Delete(m.inbox, i, i+n)
	nexts := make([]Next, n)
	for j, in := range ins {
		_, _, issue := m.lid(in.msg)
		nexts[j] = Next{Agent: "a", Key: issue, Options: AcquireOptions{MessageID: in.msg.ID}, Pauses: m.p, Stream: in.stream}
	}
	ps, err := m.l.HandoffBatch(m.ctx, nil, nexts)
	if err != nil {
		return err
	}
	m.epoch++
	for j, p := range ps {
		var locked *LockedError
		switch {
		case errors.As(p.Err(), &locked):
			m.inbox = append(m.inbox, ins[j]) // redelivered later
		case p.Err() != nil:
			return p.Err()
		default:
			m.ahead = append(m.ahead, &pauseAhead{p: p, in: ins[j], epoch: m.epoch, named: map[string]bool{}})
		}
	}
	return nil
}

// startAhead binds a lease taken ahead to its event, as the middleware does: its run
// starts without a check of its own when the batch made it (and the lease is not lost),
// else after Check.
func (m *pauseModel) startAhead(a int) error {
	if len(m.ahead) == 0 {
		return nil
	}
	i := a % len(m.ahead)
	ah := m.ahead[i]
	m.ahead = slices.Delete(m.ahead, i, i+1)
	le, err := ah.p.Take(m.ctx)
	if err != nil {
		return err
	}
	if ah.p.PauseChecked() && le.Context().Err() == nil {
		m.cov.batchChecked++
		return m.start(ah.in, le, ah)
	}
	m.cov.notChecked++
	if m.direct.HGet(m.ctx, m.p.keys.Seen, ah.in.stream+" "+ah.in.msg.ID).Val() == "w" {
		m.cov.parkedRepeat++
	}
	return m.checkRun(ah.in, le, false)
}

func (m *pauseModel) end(a int, ok bool) error {
	if len(m.runs) == 0 {
		return nil
	}
	i := a % len(m.runs)
	r := m.runs[i]
	m.runs = slices.Delete(m.runs, i, i+1)
	if _, err := r.le.Release(m.ctx); err != nil {
		return err
	}
	if !ok {
		m.inbox = append(m.inbox, pauseMsg{stream: r.stream, msg: r.msg}) // failed: redelivered
		return nil
	}
	m.done[r.stream+" "+r.lid]++
	return m.direct.XAck(m.ctx, r.stream, "g", r.msg.ID).Err()
}

func (m *pauseModel) pause(a int) error {
	s := pauseScopes[a%len(pauseScopes)]
	if _, err := m.p.Set(m.ctx, Pause{Scope: s, Reason: "model", By: "model"}); err != nil {
		return err
	}
	if m.state[s] == "" {
		m.epoch++
		m.since[s] = m.epoch
	}
	m.state[s] = pauseStatePaused
	// The pause's writer lists the live leases (inspect.Pause): those taken ahead are
	// named by their entry.
	if len(m.ahead) == 0 {
		return nil
	}
	live, err := m.l.List(m.ctx, "a")
	if err != nil {
		return err
	}
	for _, ah := range m.ahead {
		if slices.ContainsFunc(live, func(i Info) bool { return i.MessageID == ah.in.msg.ID }) {
			ah.named[s] = true
		}
	}
	return nil
}

// resume resumes a scope, dying after crashAt publishes when set; it checks that what
// it appended is in stream order.
func (m *pauseModel) resume(a int, crash bool) error {
	s := pauseScopes[a%len(pauseScopes)]
	before := map[string]string{}
	for _, st := range m.streams {
		last, _ := m.direct.XRevRangeN(m.ctx, st, "+", "-", 1).Result()
		before[st] = "0"
		if len(last) > 0 {
			before[st] = last[0].ID
		}
	}
	m.p.afterPublish = nil
	if crash {
		k := 1 + a%3
		m.p.afterPublish = func(n int) error {
			if n >= k {
				return errCrash
			}
			return nil
		}
	}
	r, err := m.p.Resume(m.ctx, s, 0)
	m.p.afterPublish = nil
	switch {
	case errors.Is(err, errCrash):
		m.state[s] = pauseStateResuming
	case err != nil:
		return err
	case !r.Again:
		// Gone, also when not Found: a lost reply's repeat finds the pause ended.
		delete(m.state, s)
		delete(m.since, s)
	}
	for _, st := range m.streams {
		added, err := m.direct.XRange(m.ctx, st, "("+before[st], "+").Result()
		if err != nil {
			return err
		}
		prev := ""
		for _, x := range added {
			pf, _ := x.Values["pf"].(string)
			if pf == "" {
				continue
			}
			if prev != "" && streamid.Compare(pf, prev) < 0 {
				return m.fail(propPauseOrder, "resume of %s appended %s after %s to %s", s, pf, prev, st)
			}
			prev = pf
		}
	}
	return nil
}

var errCrash = errors.New("model: the resume's process died")

func (m *pauseModel) do(kind string, a int) error {
	var err error
	switch kind {
	case "new":
		err = m.newEvent(a)
	case "deliver":
		err = m.deliver(a, false)
	case "deliver-die":
		err = m.deliver(a, true)
	case "batch":
		err = m.batch(a)
	case "claim":
		m.inbox, m.dead = append(m.inbox, m.dead...), nil
	case "start":
		err = m.startAhead(a)
	case "finish":
		err = m.end(a, true)
	case "fail":
		err = m.end(a, false)
	case "pause":
		err = m.pause(a)
	case "resume":
		err = m.resume(a, false)
	case "resume-die":
		err = m.resume(a, true)
	case "lose":
		// One rule armed at a time (one not met by this delivery's park meets a later
		// park or resume step): each lost reply is followed by a resend that gets one.
		if len(m.inbox) > 0 && m.proxy.Cuts() >= m.cuts {
			m.cuts = m.proxy.Cuts() + 1
			m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", m.p.keys.Reg), redistest.Command("eval", m.p.keys.Reg)), 1)
			if a%2 == 1 {
				err = m.batch(a) // the batch's script names the registry too
			} else {
				err = m.deliver(a, false)
			}
		}
	}
	if err == nil {
		err = m.read()
	}
	return err
}

// settle resumes every scope, then finishes and delivers everything.
func (m *pauseModel) settle() error {
	for _, s := range pauseScopes {
		if _, err := m.p.Resume(m.ctx, s, 0); err != nil {
			return err
		}
		delete(m.state, s)
		delete(m.since, s)
	}
	m.inbox, m.dead = append(m.inbox, m.dead...), nil
	if err := m.read(); err != nil {
		return err
	}
	for range 3000 {
		var err error
		switch {
		case len(m.runs) > 0:
			err = m.do("finish", 0)
		case len(m.ahead) > 0:
			err = m.do("start", 0)
		case len(m.inbox) > 0:
			// In batches on standalone: a redelivered parked entry meets the batch's
			// check with no pause left.
			err = m.do("batch", 2)
		default:
			return m.settled()
		}
		if err != nil {
			return err
		}
	}
	return m.fail(propPauseLeft, "did not settle")
}

func (m *pauseModel) settled() error {
	for k := range m.known {
		if n := m.done[k]; n != 1 {
			return m.fail(propPauseOnce, "event %s ran to its end %d times once settled", k, n)
		}
	}
	for _, s := range pauseScopes {
		if n := m.direct.ZCard(m.ctx, m.p.keys.line(s)).Val(); n > 0 {
			return m.fail(propPauseLeft, "%d events left in the line of %s", n, s)
		}
	}
	for _, st := range m.streams {
		if p, err := m.direct.XPending(m.ctx, st, "g").Result(); err != nil || p.Count > 0 {
			return m.fail(propPauseLeft, "entries left pending in %s: %+v %v", st, p, err)
		}
	}
	return nil
}

var pauseKinds = []struct {
	kind   string
	weight int
}{{"new", 5}, {"deliver", 6}, {"deliver-die", 2}, {"batch", 3}, {"start", 3}, {"finish", 3}, {"fail", 1}, {"pause", 2}, {"resume", 1},
	{"resume-die", 1}, {"lose", 1}, {"claim", 1}}

func genPauseSteps(r *rand.Rand, n int) []mStep {
	total := 0
	for _, k := range pauseKinds {
		total += k.weight
	}
	steps := make([]mStep, n)
	for i := range steps {
		x := r.IntN(total)
		for _, k := range pauseKinds {
			if x < k.weight {
				steps[i] = mStep{Kind: k.kind, A: r.IntN(64)}
				break
			}
			x -= k.weight
		}
	}
	return steps
}

func (e *modelEnv) runPause(format KeyFormat, steps []mStep) error {
	ns := redistest.Namespace()
	defer redistest.DeleteNamespace(context.Background(), e.direct, ns)
	l, err := New(e.client, Options{Scope: ns, TTL: 2 * time.Second, Format: format})
	if err != nil {
		return err
	}
	m := &pauseModel{ctx: context.Background(), direct: e.direct, proxy: e.proxy, l: l, p: l.Pauses(),
		streams: []string{ns + "s1", ns + "s2"}, state: map[string]string{}, done: map[string]int{}, known: map[string]bool{},
		since: map[string]int{}, cov: &e.pauses}
	for _, s := range m.streams {
		if err := e.direct.XGroupCreateMkStream(m.ctx, s, "g", "0").Err(); err != nil {
			return err
		}
	}
	defer func() {
		for _, r := range m.runs {
			r.le.stopHeartbeat()
		}
		for _, ah := range m.ahead {
			if ah.p.lease != nil {
				ah.p.lease.stopHeartbeat()
			}
		}
	}()
	for i, s := range steps {
		if os.Getenv("MODEL_TRACE") != "" {
			e.t.Logf("step %d: %s(%d) inbox %d runs %d state %v", i, s.Kind, s.A, len(m.inbox), len(m.runs), m.state)
		}
		if err := m.do(s.Kind, s.A); err != nil {
			return &stepError{at: i, err: err}
		}
	}
	return m.settle()
}

// checkPauseSeeds runs n seeds from from and returns the first failure, with its seed.
func (e *modelEnv) checkPauseSeeds(from, n int) (int, error) {
	for seed := from; seed < from+n; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 3838))
		format := KeysCompat
		if r.IntN(2) == 1 {
			format = KeysCluster
		}
		if err := e.runPause(format, genPauseSteps(r, 60)); err != nil {
			return seed, fmt.Errorf("format %d: %w", format, err)
		}
	}
	return 0, nil
}

// TestModelLeasePause runs seeded random sequences against pause, park and resume
// (MODEL_SEEDS=N, MODEL_SEED=S as TestModelLease).
func TestModelLeasePause(t *testing.T) {
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 48)
	start := time.Now()
	if seed, err := e.checkPauseSeeds(from, n); err != nil {
		t.Fatalf("pause model checker: seed %d fails: %v", seed, err)
	}
	t.Logf("%d seeds of 60 steps in %s; batches: %+v", n, time.Since(start).Round(time.Millisecond), e.pauses)
	// The batch's check is explored: runs started on it, past a later pause, leases it
	// left to the worker's check, parked entries redelivered to a batch.
	if c := e.pauses; n >= 48 && (c.batchChecked == 0 || c.pastLaterPause == 0 || c.notChecked == 0 || c.parkedRepeat == 0) {
		t.Fatalf("the batch's pause check is not explored: %+v", c)
	}
}

// TestModelLeasePausePlanted plants defects in park.lua and resume.lua, one at a
// time, and requires the model checker to catch each as the property it breaks.
func TestModelLeasePausePlanted(t *testing.T) {
	cases := []struct {
		name     string
		src      *string
		old, new string
		prop     string
	}{
		// A resume that takes the head out of the line without appending it.
		{"resume drops the head", &resumeLua, "if h and pub == ARGV[2] then", "if h and (pub == ARGV[2] or ARGV[4] == '1') then", propPauseOnce},
		// A resume that ends the pause with events still in the line.
		{"resume ends early", &resumeLua, "if not h then\n  redis.call('HDEL'", "if true then\n  redis.call('HDEL'", propPauseOnce},
		// A park that acks the entry but does not keep the event in the line.
		{"park acks without parking", &parkLua, "redis.call('ZADD', KEYS[3], ms, member)", "redis.call('ZADD', KEYS[3], ms, member) redis.call('ZREM', KEYS[3], member)", propPauseOnce},
		// A park that does not look at the pause again: a check's stale read runs it.
		{"park ignores the pause", &parkLua, "if not st or", "if true or", propPauseNoRun},
		// A park that does not recognise a repeat (a lost reply's resend parks twice).
		{"park parks a repeat", &parkLua, "if redis.call('HGET', KEYS[2], pkey) == 'w' then", "if false then", propPauseOnce},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			planted := strings.Replace(*c.src, c.old, c.new, 1)
			if planted == *c.src {
				t.Fatalf("the plant found nothing to replace: %q", c.old)
			}
			savedPark, savedResume := parkScript, resumeScript
			t.Cleanup(func() { parkScript, resumeScript = savedPark, savedResume })
			if c.src == &parkLua {
				parkScript = newScript(pauseLua + planted)
			} else {
				resumeScript = newScript(pauseLua + planted)
			}
			e := newModelEnv(t)
			seed, err := e.checkPauseSeeds(1, 48)
			if err == nil {
				t.Fatal("the model checker did not catch the planted defect")
			}
			if !strings.Contains(err.Error(), c.prop) {
				t.Fatalf("caught, but not as %s: %v", c.prop, err)
			}
			t.Logf("caught at seed %d: %v", seed, err)
		})
	}
}

// TestModelLeasePauseBatchPlanted plants defects in the pause check that
// handoff_batch.lua makes for the leases it takes ahead, one at a time, and requires
// the pause model to catch each as the property it breaks.
func TestModelLeasePauseBatchPlanted(t *testing.T) {
	cases := []struct {
		name, old, new, prop string
	}{
		// The record of parked entries not read: a redelivered parked entry runs, and
		// its copy that the resume appended runs too.
		{"batch skips the seen check", "redis.call('HGET', KEYS[pk + 2], ARGV[a + 7]) ~= 'w'", "true", propPauseOnce},
		// The registry not read: a lease taken while its scope is paused runs on the
		// batch's word.
		{"batch ignores the registry", "paused = redis.call('EXISTS', KEYS[pk + 1]) == 1", "paused = false", propPauseNoRun},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			saved := handoffBatchScript
			handoffBatchScript = newScript(leaseLua + plantLua(t, handoffBatchLua, c.old, c.new))
			t.Cleanup(func() { handoffBatchScript = saved })
			e := newModelEnv(t)
			seed, err := e.checkPauseSeeds(1, 48)
			requireCaught(t, "the model checker did not catch a batch that "+c.name[len("batch "):], seed, err, c.prop)
		})
	}
}
