package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/runners"
)

// The handlers' model checker. A seeded random driver runs a downstream agent's
// handler on several workers (each its own handler, so its own process memory, with a
// tiny ended cache; its own Redis client behind its own lossy proxy; its own lease
// manager) against the test Redis, one step at a time:
//
//   - a new event for one of a few issues;
//   - a delivery of a pending entry (new or redelivered) to a random worker, under
//     the lock middleware, with the pipeline's in-lease retries. The agent may fail
//     every attempt (stage.failed); while it runs, follow-ups arrive in its lease's
//     mailbox and it acknowledges some. Faults: the next record writes of the worker
//     are refused (at most MaxRetries-1 per delivery, so the retries can finish), a
//     command's reply is lost (go-redis sends it again), and the ack fails (the entry
//     stays pending and goes to any worker later).
//
// After every step it checks, against the results stream and the mailboxes:
//
//   - modelOneOutcome: no entry has two terminal records (stage.done, stage.failed),
//     and every entry acked has exactly one;
//   - modelOneRun: the agent ran at most once for an entry it succeeded on, and at
//     most MaxRetries times for one it failed on (it is never run again after its
//     outcome is recorded);
//   - modelFollowupKept: no follow-up has two records, and every follow-up that left
//     its mailbox has one.
//
// At the end every pending entry is delivered without faults and every mailbox drained
// by a new event of its issue: then every entry and every follow-up has exactly one
// record. A failure prints its seed, the steps that led to it, and the shortest
// sequence of those steps that still fails (each step dropped in turn while the
// remaining sequence, replayed on fresh keys, still breaks an invariant).
//
// MODEL_SEEDS=N runs N seeds (default 4) from MODEL_SEED (default 1; MODEL_SEED alone
// runs that seed); MODEL_STEPS sets the steps per seed (default 40).
func TestModelOutcomesAndFollowups(t *testing.T) {
	t.Parallel()
	from, seeds := redistest.ModelSeeds(t, 4)
	steps := modelEnvInt(t, "MODEL_STEPS", 40)
	for seed := from; seed < from+seeds; seed++ {
		t.Run("seed="+strconv.Itoa(seed), func(t *testing.T) {
			t.Parallel()
			m := newModel(t)
			bad := m.explore(rand.New(rand.NewPCG(uint64(seed), 34)), steps)
			if bad == "" {
				return
			}
			short := shrink(t, m.actions)
			t.Fatalf("model seed %d (MODEL_SEED=%d): %s\nafter the steps:\n  %s\nshortest failing sequence (%d of %d steps):\n  %s",
				seed, seed, bad, strings.Join(m.steps, "\n  "), len(short), len(m.actions), modelSequence(short))
		})
	}
}

func modelEnvInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

const (
	modelAgent, modelBranch = "backport", "c10s"
	modelWorkers            = 3
	modelRetries            = 3
)

var modelIssues = []string{"RHEL-80", "RHEL-81", "RHEL-82"}

type model struct {
	t      *testing.T
	e      *env
	stream string
	w      []*modelWorker
	agent  *modelAgentRunner

	entries   []*modelEntry
	followups map[string]string // follow-up id -> issue
	steps     []string
	actions   []modelAction // what explore did, to replay
	turn      int           // the drain's next worker
}

// modelAction is one step: a publish, or a delivery of the entry'th published entry
// (nothing when it is acked) to a worker, meeting plan.
type modelAction struct {
	publish bool
	issue   string
	failing bool
	entry   int
	worker  int
	plan    modelPlan
}

func (a modelAction) String() string {
	if a.publish {
		return fmt.Sprintf("publish an event for %s (agent fails: %v)", a.issue, a.failing)
	}
	return fmt.Sprintf("deliver event #%d to w%d: %s", a.entry, a.worker, a.plan)
}

func modelSequence(as []modelAction) string {
	lines := make([]string, len(as))
	for i, a := range as {
		lines[i] = a.String()
	}
	return strings.Join(lines, "\n  ")
}

type modelEntry struct {
	msg     *message.Message
	id      string
	issue   string
	failing bool // the agent fails every attempt for it
	acked   bool
}

type modelWorker struct {
	name  string
	h     message.NoPublishHandlerFunc
	mw    *lockmw.Middleware
	proxy *redistest.LossyProxy
	fault *refuseRecords
}

func newModel(t *testing.T) *model {
	var issues []fakejira.Issue
	for _, k := range modelIssues {
		issues = append(issues, fakejira.Issue{Key: k, Labels: []string{"ymir_triaged_backport"}})
	}
	e := newEnv(t, issues...)
	m := &model{t: t, e: e,
		stream: e.topo.Stream(modelAgent, modelBranch, false), followups: map[string]string{}}
	m.agent = &modelAgentRunner{m: m, runs: map[string]int{}}
	for _, src := range []string{"../internal/xonce/xadd_once.lua"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		// Loaded up front: a lost reply is then that of a command that ran.
		if err := e.rdb.ScriptLoad(context.Background(), string(b)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range modelWorkers {
		m.w = append(m.w, m.worker("w"+strconv.Itoa(i)))
	}
	return m
}

func (m *model) worker(name string) *modelWorker {
	t, e := m.t, m.e
	proxy := redistest.NewLossyProxy(t, e.rdb.Options().Addr)
	c := proxy.Client(e.rdb.Options())
	fault := &refuseRecords{}
	c.AddHook(fault)
	h, err := handlers.New(handlers.Config{Agent: modelAgent, Branch: modelBranch, Runner: m.agent, Jira: e.jc,
		Publisher: event.NewPublisher(c, 0), Results: event.NewResults(c, e.topo.Results(), 0), Topology: e.topo,
		MaxRetries: modelRetries, Logger: e.log, Mailbox: true, EndedCache: 2})
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lease.New(c, lease.Options{Scope: e.topo.LockScope(), TTL: time.Minute, Owner: name})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: locker, Agent: modelAgent})
	if err != nil {
		t.Fatal(err)
	}
	return &modelWorker{name: name, h: h, mw: mw, proxy: proxy, fault: fault}
}

// explore takes steps random steps, checking after each, then drains and checks the
// end state. It returns the first invariant broken ("" for none).
func (m *model) explore(rng *rand.Rand, steps int) string {
	for range steps {
		var a modelAction
		if p := m.pending(); len(p) == 0 || rng.IntN(10) < 4 {
			a = modelAction{publish: true, issue: modelIssues[rng.IntN(len(modelIssues))], failing: rng.IntN(6) == 0}
		} else {
			en := p[rng.IntN(len(p))]
			a = modelAction{entry: slices.Index(m.entries, en), worker: rng.IntN(len(m.w)), plan: randomPlan(rng, en)}
		}
		if bad := m.do(a); bad != "" {
			return bad
		}
	}
	return m.finish()
}

// replay does as on fresh keys: the first invariant broken, or "".
func (m *model) replay(as []modelAction) string {
	for _, a := range as {
		if bad := m.do(a); bad != "" {
			return bad
		}
	}
	return m.finish()
}

func (m *model) do(a modelAction) string {
	m.actions = append(m.actions, a)
	if a.publish {
		m.publish(a.issue, a.failing)
	} else if a.entry < len(m.entries) && !m.entries[a.entry].acked {
		m.deliver(m.entries[a.entry], m.w[a.worker], a.plan)
	}
	return m.check(false)
}

func (m *model) finish() string {
	m.drain()
	return m.check(true)
}

// shrink drops steps of a failing sequence one at a time, keeping each drop after which
// a replay on fresh keys still fails, until none can go (at most 300 replays).
func shrink(t *testing.T, as []modelAction) []modelAction {
	as = slices.Clone(as)
	replays := 0
	for shrunk := true; shrunk && replays < 300; {
		shrunk = false
		for i := len(as) - 1; i >= 0 && replays < 300; i-- {
			try := slices.Delete(slices.Clone(as), i, i+1)
			replays++
			if newModel(t).replay(try) != "" {
				as, shrunk = try, true
			}
		}
	}
	for i := range as {
		as[i].plan = simpler(t, as, i)
	}
	return as
}

// simpler returns the plan of as[i] with each fault that the failure does not need
// taken out.
func simpler(t *testing.T, as []modelAction, i int) modelPlan {
	for _, drop := range []func(*modelPlan){
		func(p *modelPlan) { p.refuse = 0 }, func(p *modelPlan) { p.lose = "" },
		func(p *modelPlan) { p.arrive = nil }, func(p *modelPlan) { p.ackFails = false },
	} {
		try := slices.Clone(as)
		drop(&try[i].plan)
		if !reflect.DeepEqual(try[i].plan, as[i].plan) && newModel(t).replay(try) != "" {
			as = try
		}
	}
	return as[i].plan
}

func (m *model) pending() []*modelEntry {
	var out []*modelEntry
	for _, en := range m.entries {
		if !en.acked {
			out = append(out, en)
		}
	}
	return out
}

func (m *model) logf(format string, args ...any) {
	m.steps = append(m.steps, fmt.Sprintf(format, args...))
}

func (m *model) publish(issue string, failing bool) *modelEntry {
	msg := m.e.published(downstreamMsg(m.t, modelAgent, issue, "rhel-10.1", false), m.stream)
	en := &modelEntry{msg: msg, id: event.EntryID(msg), issue: issue, failing: failing}
	m.entries = append(m.entries, en)
	m.logf("publish %s for %s (agent fails: %v)", en.id, issue, failing)
	return en
}

// deliver runs one delivery of en on w meeting plan, and acks it (or fails to) when
// the handler ended it.
func (m *model) deliver(en *modelEntry, w *modelWorker, plan modelPlan) {
	m.logf("deliver %s to %s: %s", en.id, w.name, plan)
	w.fault.arm(plan.refuse)
	if plan.lose != "" {
		w.proxy.LoseReply(redistest.Command(plan.lose), 1)
	}
	m.agent.set(plan)
	msg := redelivery(en.msg)
	var last error
	_, err := w.mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		for n := 1; n <= modelRetries; n++ {
			last = attempt(w.h, msg, n)
			if last == nil || errors.Is(last, event.ErrOutcomeRecorded) {
				break
			}
		}
		return nil, last
	})(msg)
	w.fault.arm(0)
	switch {
	case err != nil && !errors.Is(err, event.ErrOutcomeRecorded):
		m.logf("  -> error, left pending: %v", err)
	case plan.ackFails:
		m.logf("  -> ended (%v); its ack fails", err)
	default:
		en.acked = true
		m.logf("  -> ended (%v), acked", err)
	}
}

// modelPlan is what one delivery meets.
type modelPlan struct {
	refuse   int    // record writes refused
	lose     string // a command whose reply is lost once ("": none)
	arrive   []bool // follow-ups that arrive while the agent runs: whether it acknowledges each
	ackFails bool
}

func (p modelPlan) String() string {
	return fmt.Sprintf("refuse %d record(s), lose reply of %q, %d follow-up(s) arrive (acked %v), ack fails %v",
		p.refuse, p.lose, len(p.arrive), p.arrive, p.ackFails)
}

func randomPlan(rng *rand.Rand, en *modelEntry) modelPlan {
	p := modelPlan{ackFails: rng.IntN(3) == 0}
	if !en.failing {
		// Refusals on an entry the agent fails would use up its attempts and
		// redeliver it (rightly run again); the agent's own failures do that already.
		p.refuse = rng.IntN(modelRetries)
	}
	for range rng.IntN(3) {
		p.arrive = append(p.arrive, rng.IntN(2) == 0)
	}
	p.lose = []string{"", "evalsha", "get", ""}[rng.IntN(4)]
	return p
}

// drain delivers every pending entry without faults, then gives every mailbox that
// still holds follow-ups a new event of its issue, until none is left.
func (m *model) drain() {
	m.logf("drain")
	for range 10 {
		for _, en := range m.pending() {
			m.deliver(en, m.nextWorker(), modelPlan{})
		}
		left := false
		for _, issue := range modelIssues {
			if m.mailboxLen(issue) > 0 {
				left = true
				m.deliver(m.publish(issue, false), m.nextWorker(), modelPlan{})
			}
		}
		if !left && len(m.pending()) == 0 {
			return
		}
	}
}

func (m *model) nextWorker() *modelWorker {
	m.turn++
	return m.w[m.turn%len(m.w)]
}

func (m *model) mailboxKey(issue string) string {
	return m.e.locker().Keys(modelAgent, issue).Mailbox
}

func (m *model) mailboxLen(issue string) int64 {
	return m.e.rdb.XLen(context.Background(), m.mailboxKey(issue)).Val()
}

// check verifies the invariants now (final: the drained end state) and returns those
// broken, or "".
func (m *model) check(final bool) string {
	ctx := context.Background()
	terminal := map[string]int{}
	followup := map[string]int{}
	for _, r := range m.e.entries(m.e.topo.Results()) {
		switch et := r.Values["event_type"]; et {
		case event.StageDone, event.StageFailed:
			terminal[r.Values["message_id"].(string)]++
		case event.FollowupRolled, event.FollowupDelivered:
			followup[r.Values["outcome"].(string)]++
		}
	}
	var bad []string
	for _, en := range m.entries {
		n := terminal[en.id]
		if n > 1 || ((en.acked || final) && n != 1) {
			bad = append(bad, fmt.Sprintf("modelOneOutcome: entry %s (acked %v) has %d terminal records", en.id, en.acked, n))
		}
		runs, most := m.agent.runsOf(en.id), 1
		if en.failing {
			most = modelRetries
		}
		if runs > most {
			bad = append(bad, fmt.Sprintf("modelOneRun: the agent ran %d times for entry %s (at most %d)", runs, en.id, most))
		}
	}
	inMailbox := map[string]bool{}
	for _, issue := range modelIssues {
		for _, x := range m.e.rdb.XRange(ctx, m.mailboxKey(issue), "-", "+").Val() {
			inMailbox[x.ID] = true
		}
	}
	for id := range m.followups {
		n := followup[id]
		if n > 1 || ((!inMailbox[id] || final) && n != 1) {
			bad = append(bad, fmt.Sprintf("modelFollowupKept: follow-up %s (in its mailbox %v) has %d records", id, inMailbox[id], n))
		}
	}
	return strings.Join(bad, "\n")
}

// modelAgentRunner is the agent: it counts its runs per entry, lets the plan's
// follow-ups arrive in its lease's mailbox while it runs, acknowledges those the plan
// says, and fails every attempt of a failing entry.
type modelAgentRunner struct {
	m    *model
	mu   sync.Mutex
	runs map[string]int
	plan modelPlan
}

func (a *modelAgentRunner) set(p modelPlan) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.plan = p
}

func (a *modelAgentRunner) runsOf(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[id]
}

func (a *modelAgentRunner) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	a.mu.Lock()
	a.runs[req.MessageID]++
	plan := a.plan
	a.plan.arrive = nil // they arrive once, during the delivery's first run
	a.mu.Unlock()
	m := a.m
	for i := range plan.arrive {
		id, err := m.e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: m.mailboxKey(req.IssueKey), Values: map[string]any{
			"event_type": event.CommentCreated, "comment_id": strconv.Itoa(len(m.followups)), "author": "ann", "n": i}}).Result()
		if err != nil {
			return runners.Result{}, err
		}
		m.followups[id] = req.IssueKey
		m.logf("  follow-up %s arrives for %s", id, req.IssueKey)
	}
	res := runners.Result{Success: true}
	if len(plan.arrive) > 0 && req.Mailbox != nil {
		fs, err := req.Mailbox.Next(ctx)
		if err != nil {
			return runners.Result{}, err
		}
		for i, f := range fs {
			res.Delivered = append(res.Delivered, f.ID)
			if i < len(plan.arrive) && plan.arrive[i] {
				res.FollowupsAcked = append(res.FollowupsAcked, f.ID)
			}
		}
	}
	if slices.ContainsFunc(m.entries, func(en *modelEntry) bool { return en.id == req.MessageID && en.failing }) {
		return runners.Result{Success: false, Error: "the model's agent fails this entry"}, nil
	}
	return res, nil
}

// refuseRecords is a worker's fault: armed with n, it refuses the worker's next n
// record writes (a script call carrying a terminal or follow-up record) before they
// reach Redis, as a timeout would.
type refuseRecords struct {
	mu   sync.Mutex
	left int
}

func (r *refuseRecords) arm(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.left = n
}

func (r *refuseRecords) take(cmd redis.Cmder) bool {
	name := cmd.Name()
	if name != "evalsha" && name != "eval" {
		return false
	}
	isRecord := false
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && (s == event.StageDone || s == event.StageFailed || strings.HasPrefix(s, "followup.")) {
			isRecord = true
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !isRecord || r.left == 0 {
		return false
	}
	r.left--
	return true
}

func (r *refuseRecords) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *refuseRecords) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if r.take(cmd) {
			err := errors.New("model: record write refused")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (r *refuseRecords) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
