package lease

// The lease's model checker (issue 34): a small in-memory reference model of a lease
// key (free, held, held with a queued follow-up, held with a mailbox, being
// superseded, given back, released, expired, taken by force) driven by seeded random
// sequences against the real Redis, with faults between the calls: a lost reply
// (go-redis sends the script again), a worker crash (its lease abandoned), the
// server's clock running ahead of the worker's (the key expires under a live holder)
// and both key formats. After every step the model and the real keys are compared
// and the invariants of docs/architecture.md are checked; a failure prints its seed
// and the shortest sequence found. MODEL_SEEDS=N runs N seeds (default 48).
// TestModelLeaseBatch (model_batch_test.go) adds the batched hand-off's step.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/streamid"
)

// The model's properties: each names an invariant of docs/architecture.md.
const (
	propExclusive  = "Exclusive"          // no two runs of one guarded key overlap
	propFence      = "FenceIncreases"     // fences only increase per key
	propAgrees     = "ModelAgrees"        // the real reply is one the model allows
	propHolder     = "HolderOwnsKey"      // the model's holder is the real key's holder
	propStale      = "StaleWritesRefused" // a superseded, evicted or expired holder cannot write
	propGiveBack   = "GiveBackRecordsNone"
	propFollowup   = "FollowupPublishedOnce"
	propStranded   = "NothingStranded"
	propTerminal   = "OneTerminalRecord"
	propSupersWait = "SupersedeWaitsForStop"
	propBatch      = "BatchEndsAsRelease" // a batch's end is a release dated by its run's end, then its XACK
	propEndedOnce  = "EndCountedOnce"     // each lease is counted once as it ends: released or lost (Observer)
)

// mStep is one step of a sequence. Its targets are picked among what exists when it
// runs (A modulo their number), so a shorter sequence still means something.
type mStep struct {
	Kind    string
	A, B, C int
}

func (s mStep) String() string { return fmt.Sprintf("%s(%d,%d,%d)", s.Kind, s.A, s.B, s.C) }

// stepKind is a kind of step and its weight in a random sequence.
type stepKind struct {
	kind   string
	weight int
}

// stepKinds are TestModelLease's steps. (TestModelLeaseBatch adds the batch step,
// batchKinds: a new kind here would change every seed's sequence, and the seeds that
// once found a defect would no longer replay it.)
var stepKinds = []stepKind{
	{"new", 6}, {"deliver", 8}, {"start", 3}, {"end", 5}, {"fail", 1}, {"giveback", 2},
	{"crash", 1}, {"expire", 1}, {"clock", 1}, {"force", 1}, {"stale", 2},
}

func genSteps(r *rand.Rand, n int, kinds []stepKind) []mStep {
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	out := make([]mStep, n)
	for i := range out {
		w := r.IntN(total)
		kind := ""
		for _, k := range kinds {
			if w < k.weight {
				kind = k.kind
				break
			}
			w -= k.weight
		}
		out[i] = mStep{Kind: kind, A: r.IntN(64), B: r.IntN(64), C: r.IntN(64)}
	}
	return out
}

// mConfig is what one seed runs under: a key format, a scope, and a busy-policy
// table (event type -> policy, "*" the default), as ON_CONFLICT and LOCK_SCOPE give.
type mConfig struct {
	Format KeyFormat
	Scope  string // agent, issue or group
	Table  map[string]string
	// Mixed: the events whose rule coalesces or delivers come from a second worker's
	// middleware, so only their leases drain; the others' are Batchable and may end
	// (in a batch) with a follow-up queued behind them, which their release publishes.
	Mixed bool
	// Twin: every other new event enters the :todo twin of the stream, in the
	// millisecond of the stream's last entry (its id is often that entry's id), as a
	// worker reads both (TestModelLeaseTwin).
	Twin bool
}

func (c mConfig) String() string {
	types := make([]string, 0, len(c.Table))
	for t := range c.Table {
		types = append(types, t+"="+c.Table[t])
	}
	sort.Strings(types)
	f := "standalone"
	if c.Format == KeysCluster {
		f = "cluster"
	}
	mixed := ""
	if c.Mixed {
		mixed = " mixed"
	}
	if c.Twin {
		mixed += " todo-twin"
	}
	return fmt.Sprintf("format=%s scope=%s on_conflict=%s%s", f, c.Scope, strings.Join(types, ","), mixed)
}

func (c mConfig) policy(typ string) string {
	if p, ok := c.Table[typ]; ok {
		return p
	}
	return c.Table["*"]
}

// drains: some rule coalesces or delivers, so every lease of typ drains (the
// middleware's Drain); when Mixed, the leases of those rules' types alone.
func (c mConfig) drains(typ string) bool {
	if c.Mixed {
		p := c.policy(typ)
		return p == "coalesce" || p == "deliver"
	}
	for _, p := range c.Table {
		if p == "coalesce" || p == "deliver" {
			return true
		}
	}
	return false
}

var modelTypes = []string{"a.x", "b.x", "c.x"}

func genConfig(r *rand.Rand) mConfig {
	c := mConfig{Format: KeyFormat(r.IntN(2)), Scope: []string{"agent", "agent", "issue", "group"}[r.IntN(4)],
		Table: map[string]string{}}
	pols := []string{"drop", "coalesce", "deliver", "supersede", "delay"}
	if c.Scope != "agent" {
		pols = []string{"drop", "delay"} // the middleware refuses the others with a shared scope
	}
	c.Table["*"] = pols[r.IntN(len(pols))]
	for _, t := range modelTypes[:r.IntN(3)] {
		c.Table[t] = pols[r.IntN(len(pols))]
	}
	return c
}

// --- the model ---

type mEvent struct {
	n                   int
	id                  string
	stream              string // its entry's: the stream, or its :todo twin (Twin)
	agent, issue, group string
	typ                 string
	created             int // step index
	origin              int // the event a follow-up copies, else 0
	terminal            string
	retried             bool // its lease ended under it (crash, clock, force): run again
}

type runState int

const (
	runWaiting runState = iota // took the key over; waits for the superseded run to stop
	runRunning                 // holds the key and runs
	runStale                   // the key is no longer its own; the worker has not noticed
	runCrashed                 // the worker died; its key expires by itself
	runDone
)

type mRun struct {
	ev       *mEvent
	le       *Lease
	state    runState
	why      string  // runStale: superseded, forced or clock
	preds    []*mRun // runs superseded on its way in, which must stop before it runs
	keys     []string
	policy   string
	released bool
	waited   bool // it took the key over, or waited for a superseded run: it had not started when it became stale
	from     int  // the step that acquired it
}

type mQueued struct {
	ev   *mEvent
	mbox bool
}

type mKey struct {
	holder     *mRun
	fence      int64
	queue      *mQueued
	mailbox    int
	lastRunMid string
	// lastRunEntry is the last run's entry, stream and id: its own retry is exempt from
	// the superseded check, the twin stream's entry of its id is not.
	lastRunEntry string
	lastRun      int // step of the last release by a run
	lastPub      int // step of the last follow-up published
	// lastRunLo and lastRunHi bound the last release's date (Unix ms, [lo, hi)) when a
	// batch dated it by its run's end; 0 after a plain release (dated when it ran).
	lastRunLo, lastRunHi int64
	// stopping are the runs superseded on the key whose field of the stop hash is
	// still there: a newer run waits for them.
	stopping []*mRun
}

type modelRun struct {
	t      testing.TB
	ends   *endTally // what the Locker's Observer was told
	cfg    mConfig
	direct *redis.Client
	proxy  *redistest.LossyProxy
	l      *Locker
	ns     string
	stream string
	ctx    context.Context

	step    int
	events  []*mEvent
	byID    map[string]*mEvent
	inbox   []*mEvent
	pending []*mRun // crashed, not yet expired
	runs    []*mRun // live: waiting, running, stale
	keys    map[string]*mKey
	lastID  string
	expPub  []*mEvent   // follow-ups the model expects published by this step
	mayPub  []*mEvent   // follow-ups the step may or may not publish
	stepAt  []time.Time // when each step began (index: step)
	grouped bool        // the stream's consumer group exists (the batch step acks in it)
	batches *batchStats
}

func (m *modelRun) key(k string) *mKey {
	if m.keys[k] == nil {
		m.keys[k] = &mKey{}
	}
	return m.keys[k]
}

func ownKey(ev *mEvent) string { return ev.agent + ":" + ev.issue }

func (m *modelRun) sharedKeys(ev *mEvent) []string {
	switch m.cfg.Scope {
	case "issue":
		return []string{"@issue:" + ev.issue}
	case "group":
		return []string{"@group:" + ev.group}
	}
	return nil
}

func (m *modelRun) fail(prop, format string, args ...any) error {
	return fmt.Errorf("property %s: step %d: %s", prop, m.step, fmt.Sprintf(format, args...))
}

// --- steps ---

func (m *modelRun) newEvent(s mStep, origin *mEvent) (*mEvent, error) {
	ev := &mEvent{n: len(m.events) + 1, agent: []string{"ag1", "ag2"}[s.A%2], issue: []string{"P-1", "P-2"}[s.B%2],
		group: []string{"G1", "G2"}[s.C%2], typ: modelTypes[(s.A/2)%3], created: m.step}
	if origin != nil {
		ev.agent, ev.issue, ev.group, ev.typ, ev.origin = origin.agent, origin.issue, origin.group, origin.typ, origin.n
		return ev, nil // appended by the release that published it
	}
	ev.stream = m.stream
	id, twinOf := "*", (*mEvent)(nil)
	if m.cfg.Twin && (s.C/2)%2 == 1 {
		// In the millisecond of the stream's last new event, as two producers' events
		// enter: it entered with that one (its created step), and reaches the stream now.
		ev.stream = m.stream + ":todo"
		for _, e := range slices.Backward(m.events) {
			if e.stream == m.stream && e.origin == 0 {
				ms, _, _ := strings.Cut(e.id, "-")
				id, twinOf = ms+"-*", e
				break
			}
		}
	}
	got, err := m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: ev.stream, ID: id, Values: map[string]any{"drv": ev.n}}).Result()
	if err != nil && id != "*" {
		// The twin has a later entry already: this one enters now.
		got, err = m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: ev.stream, Values: map[string]any{"drv": ev.n}}).Result()
		twinOf = nil
	}
	if err != nil {
		return nil, err
	}
	if twinOf != nil {
		ev.created = twinOf.created
	}
	ev.id = got
	m.add(ev)
	return ev, nil
}

// entry names ev's entry: its stream and id (ids repeat across streams).
func (ev *mEvent) entry() string { return ev.stream + " " + ev.id }

func (m *modelRun) add(ev *mEvent) {
	m.events = append(m.events, ev)
	m.byID[ev.id] = ev
	m.inbox = append(m.inbox, ev)
}

func (m *modelRun) fields(ev *mEvent) map[string]any {
	return map[string]any{"ev": ev.n, "agent": ev.agent, "issue": ev.issue, "group": ev.group, "typ": ev.typ}
}

func (m *modelRun) options(ev *mEvent) AcquireOptions {
	ao := AcquireOptions{MessageID: ev.id, Stream: ev.stream, EntryTime: streamid.Time(ev.id), Drain: m.cfg.drains(ev.typ), Owner: "w"}
	for _, k := range m.sharedKeys(ev) {
		sc, key, _ := strings.Cut(strings.TrimPrefix(k, "@"), ":")
		ao.Shared = append(ao.Shared, ScopeKey{Scope: Scope(sc), Key: key})
	}
	switch m.cfg.policy(ev.typ) {
	case "coalesce":
		ao.Queue = &QueuedEvent{Stream: m.stream, Fields: m.fields(ev)}
	case "deliver":
		ao.Deliver = &DeliverOptions{Followup: map[string]any{"ev": ev.n}, Event: QueuedEvent{Stream: m.stream, Fields: m.fields(ev)}}
	case "supersede":
		ao.Supersede, ao.Drain = true, false // as the middleware does
	}
	return ao
}

// loseNext arms the proxy to lose the reply of the next script on ev's own key.
func (m *modelRun) loseNext(ev *mEvent) {
	frag := m.ns + ev.agent + ":" + ev.issue // this run's keys only: a rule left armed fires in no later run
	m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", frag), redistest.Command("eval", frag)), 1)
}

func pick[T any](xs []T, i int) (T, int, bool) {
	var zero T
	if len(xs) == 0 {
		return zero, -1, false
	}
	i %= len(xs)
	return xs[i], i, true
}

func (m *modelRun) runsIn(states ...runState) []*mRun {
	var out []*mRun
	for _, r := range m.runs {
		for _, s := range states {
			if r.state == s {
				out = append(out, r)
			}
		}
	}
	return out
}

func (m *modelRun) deliver(s mStep) error {
	ev, i, ok := pick(m.inbox, s.A)
	if !ok {
		return nil
	}
	m.inbox = append(m.inbox[:i], m.inbox[i+1:]...)
	if s.B%4 == 0 {
		m.loseNext(ev)
	}
	return m.acquire(ev)
}

// outcome names a real acquire's result.
func outcome(le *Lease, err error) string {
	var locked *LockedError
	var sup *SupersededError
	switch {
	case err == nil && le.Supersedes() != "":
		return "takeover"
	case err == nil:
		return "granted"
	case errors.As(err, &sup):
		return "superseded"
	case errors.As(err, &locked) && locked.Queued:
		return "queued"
	case errors.As(err, &locked) && locked.Delivered:
		return "delivered"
	case errors.As(err, &locked):
		return "busy"
	}
	return "error: " + err.Error()
}

// expect is what the model allows an acquire of ev to answer.
func (m *modelRun) expect(ev *mEvent) map[string]bool {
	pol := m.cfg.policy(ev.typ)
	k := m.key(ownKey(ev))
	allowed := map[string]bool{}
	if pol == "supersede" {
		if k.lastRunMid != "" && streamid.Compare(ev.id, k.lastRunMid) < 0 {
			allowed["superseded"] = true
			return allowed
		}
		switch {
		case k.holder == nil:
			allowed["granted"] = true
		case streamid.Compare(k.holder.ev.id, ev.id) < 0:
			allowed["takeover"] = true
		default:
			allowed["busy"] = true
		}
		return allowed
	}
	// The superseded check compares the entry's time with the last run's release (the
	// last follow-up's publication for coalesce and deliver), in milliseconds: an event
	// that entered before it may be refused, one that entered after it may not.
	// A retry of the last run's own event is exempt from the first, not from the
	// second: the newer follow-up stands for it.
	switch {
	case pol == "coalesce" || pol == "deliver":
		if k.lastPub > ev.created {
			allowed["superseded"] = true
		}
	case k.lastRun > ev.created && k.lastRunEntry != ev.entry():
		// A batch's release has a known date: an entry before it is refused, busy key
		// or not (the check comes first), and one after it is not.
		ms := streamid.Time(ev.id).UnixMilli()
		if k.lastRunHi != 0 && ms < k.lastRunLo {
			return map[string]bool{"superseded": true}
		}
		if k.lastRunHi == 0 || ms < k.lastRunHi {
			allowed["superseded"] = true
		}
	}
	busy := k.holder != nil
	for _, sk := range m.sharedKeys(ev) {
		busy = busy || m.key(sk).holder != nil
	}
	switch {
	case !busy:
		allowed["granted"] = true
	case pol == "coalesce" && k.holder != nil:
		allowed["queued"] = true
	case pol == "deliver" && k.holder != nil:
		allowed["delivered"] = true
	default:
		allowed["busy"] = true
	}
	return allowed
}

func (m *modelRun) acquire(ev *mEvent) error {
	allowed := m.expect(ev)
	le, err := m.l.Acquire(m.ctx, ev.agent, ev.issue, m.options(ev))
	return m.acquired(ev, allowed, le, err)
}

// acquired checks an acquire's result (le or err) against allowed, the model's expect
// before it, and books it: a run that holds the key, or the event's record.
func (m *modelRun) acquired(ev *mEvent, allowed map[string]bool, le *Lease, err error) error {
	got := outcome(le, err)
	if !allowed[got] {
		if le != nil {
			le.stopHeartbeat()
		}
		prop := propAgrees
		if (got == "granted" || got == "takeover") && m.holders(ev) != "" {
			prop = propExclusive // (a grant of keys nobody holds, refused by the model, is not)
		}
		return m.fail(prop, "acquire of event %d (%s %s type %s policy %s id %s%s): got %s, model allows %v (holders: %s)",
			ev.n, ownKey(ev), ev.group, ev.typ, m.cfg.policy(ev.typ), ev.id, followupOf(ev), got, keysOf(allowed), m.holders(ev))
	}
	k := m.key(ownKey(ev))
	switch got {
	case "superseded":
		return m.terminal(ev, "superseded")
	case "busy":
		if m.cfg.policy(ev.typ) == "delay" {
			m.inbox = append(m.inbox, ev) // re-queued: it comes back later
			return nil
		}
		return m.terminal(ev, "dropped")
	case "queued":
		k.queue = &mQueued{ev: ev}
		return m.terminal(ev, "coalesced")
	case "delivered":
		k.queue = &mQueued{ev: ev, mbox: true}
		k.mailbox++
		return m.terminal(ev, "delivered")
	}
	r := &mRun{ev: ev, le: le, state: runRunning, policy: m.cfg.policy(ev.typ), keys: append([]string{ownKey(ev)}, m.sharedKeys(ev)...), from: m.step}
	if (got == "granted" || got == "takeover") && le.stopping < 0 {
		// Every acquire script reports them; one that stopped would cost each run a
		// round trip (WaitStopped asking) that nothing else shows.
		return m.fail(propAgrees, "event %d: its grant does not report the runs still stopping on its key", ev.n)
	}
	if got == "granted" && middlewareWaits(le) {
		r.state, r.waited = runWaiting, true
		for _, p := range k.stopping {
			if !p.released {
				r.preds = append(r.preds, p)
			}
		}
	}
	if got == "takeover" {
		old := k.holder
		if old.state != runCrashed {
			old.state, old.why = runStale, "superseded"
		}
		r.state, r.waited = runWaiting, true
		k.stopping = append(k.stopping, old)
		for _, p := range k.stopping {
			if !p.released {
				r.preds = append(r.preds, p)
			}
		}
	}
	fences := []int64{le.Fence()}
	for _, s := range le.Shared() {
		fences = append(fences, s.Fence)
	}
	if len(fences) != len(r.keys) {
		return m.fail(propAgrees, "event %d: lease holds %d keys, model %d", ev.n, len(fences), len(r.keys))
	}
	for i, name := range r.keys {
		mk := m.key(name)
		// Strictly above every earlier one (an acquire that gave its key back, busy on
		// another, may have used one up).
		if fences[i] <= mk.fence {
			return m.fail(propFence, "event %d: fence of %s is %d, not above the key's last fence %d", ev.n, name, fences[i], mk.fence)
		}
		mk.fence = fences[i]
		mk.holder = r
	}
	m.runs = append(m.runs, r)
	return nil
}

// middlewareWaits mirrors lockmw's Handler: a run waits for every run superseded on its
// key that has not stopped yet (WaitStopped), whether or not its own acquire took one
// over. It once waited only after a take-over (Supersedes), so a grant of a key whose
// superseded run was still stopping (its take-over lease given back) started at once:
// property Exclusive, seed 34 (new deliver new deliver giveback deliver).
func middlewareWaits(le *Lease) bool {
	if le.stopping < 0 { // not told by its acquire: WaitStopped asks, as here
		n, err := le.stillStopping(context.Background())
		return err != nil || n > 0
	}
	return le.stopping > 0
}

// followupOf says which event a published follow-up copies.
func followupOf(ev *mEvent) string {
	if ev.origin == 0 {
		return ""
	}
	return fmt.Sprintf(", the follow-up of event %d published at step %d", ev.origin, ev.created)
}

// holders names the model's holders of ev's keys.
func (m *modelRun) holders(ev *mEvent) string {
	var b strings.Builder
	for _, name := range append([]string{ownKey(ev)}, m.sharedKeys(ev)...) {
		if h := m.key(name).holder; h != nil {
			fmt.Fprintf(&b, "%s by event %d (%s %s, state %d); ", name, h.ev.n, ownKey(h.ev), h.ev.group, h.state)
		}
	}
	return b.String()
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (m *modelRun) terminal(ev *mEvent, rec string) error {
	if ev.terminal != "" {
		return m.fail(propTerminal, "event %d recorded %s after %s", ev.n, rec, ev.terminal)
	}
	ev.terminal = rec
	return nil
}

// start lets a run that took the key over begin, once the run it superseded stopped.
func (m *modelRun) start(s mStep) error {
	r, _, ok := pick(m.runsIn(runWaiting), s.A)
	if !ok {
		return nil
	}
	n, err := stopWaitScript.Run(m.ctx, m.direct, []string{r.le.keys.Stop}, r.le.token).Int64()
	if err != nil {
		return err
	}
	live, crashed := 0, 0
	for _, p := range r.preds {
		switch {
		case p.state == runCrashed:
			crashed++
		case !p.released:
			live++
		}
	}
	if n == 0 && live > 0 {
		return m.fail(propSupersWait, "event %d would start while %d superseded run(s) still run", r.ev.n, live)
	}
	if n > int64(live+crashed) {
		return m.fail(propSupersWait, "event %d waits for %d run(s); only %d have not stopped", r.ev.n, n, live+crashed)
	}
	if n == 0 {
		r.state, r.waited = runRunning, false
	}
	return nil
}

func (m *modelRun) removeRun(r *mRun) {
	for i, x := range m.runs {
		if x == r {
			m.runs = append(m.runs[:i], m.runs[i+1:]...)
			return
		}
	}
}

// doneRecord is the real done record of ev's own key.
func (m *modelRun) doneRecord(r *mRun) string {
	v, _ := m.direct.Get(m.ctx, r.le.keys.Done).Result()
	return v
}

// release ends a held run: ran (the run's outcome stands), failed (the event is
// retried), or given back (no run happened).
func (m *modelRun) release(r *mRun, how string, lose bool) error {
	if lose {
		m.loseNext(r.ev)
	}
	if err := m.readMailbox(r, how); err != nil {
		return err
	}
	before := m.doneRecord(r)
	var deleted bool
	var err error
	if how == "giveback" {
		r.le.giveBack(m.ctx)
		deleted = true
	} else {
		deleted, err = r.le.Release(m.ctx)
	}
	if err != nil {
		return err
	}
	if !deleted && !lose {
		// (After a lost reply the resent script finds the key gone and says so.)
		return m.fail(propHolder, "event %d: release of the key's holder deleted nothing", r.ev.n)
	}
	return m.released(r, how, before)
}

// readMailbox: a run that ends as ran first takes the follow-ups delivered to its
// mailbox (the release then drops the queued event that stands for them).
func (m *modelRun) readMailbox(r *mRun, how string) error {
	k := m.key(ownKey(r.ev))
	if how != "ran" || k.mailbox == 0 || r.state != runRunning {
		return nil
	}
	fs, err := r.le.Mailbox(m.ctx, "", 0)
	if err != nil {
		return err
	}
	ids := make([]string, len(fs))
	for i, f := range fs {
		ids[i] = f.ID
	}
	if _, err := r.le.MailboxDone(m.ctx, ids...); err != nil {
		return err
	}
	k.mailbox -= len(ids)
	return nil
}

// released books the real release of r (before is its done record before): its key is
// no longer its own, a run's release dates the key's last run and drains its queue.
func (m *modelRun) released(r *mRun, how, before string) error {
	k := m.key(ownKey(r.ev))
	if v, _ := m.direct.Get(m.ctx, r.le.keys.Lock).Result(); v == r.le.token {
		return m.fail(propHolder, "event %d: its key %s still holds its token after its release", r.ev.n, r.le.keys.Lock)
	}
	r.released, r.state = true, runDone
	m.removeRun(r)
	for _, name := range r.keys {
		if m.key(name).holder == r {
			m.key(name).holder = nil
		}
	}
	if how == "giveback" {
		if after := m.doneRecord(r); after != before {
			return m.fail(propGiveBack, "event %d: a give-back wrote the done record %q (was %q): events that entered before it count as superseded by a run that never happened", r.ev.n, after, before)
		}
		m.mayDrain(k)
		m.inbox = append(m.inbox, r.ev)
		return nil
	}
	k.lastRunMid, k.lastRunEntry, k.lastRun, k.lastRunLo, k.lastRunHi = r.ev.id, r.ev.entry(), m.step, 0, 0
	m.drain(k)
	if how == "fail" {
		m.inbox = append(m.inbox, r.ev)
		return nil
	}
	return m.terminal(r.ev, "ran")
}

// drain is what the holder's release does with the key's queued follow-up: publish it,
// or drop a deliver policy's whose mailbox the runs emptied.
func (m *modelRun) drain(k *mKey) {
	if k.queue == nil {
		return
	}
	if !k.queue.mbox || k.mailbox != 0 {
		m.expPub = append(m.expPub, k.queue.ev)
		k.lastPub = m.step
	}
	k.queue = nil
}

func (m *modelRun) mayDrain(k *mKey) {
	if k.queue != nil {
		m.mayPub = append(m.mayPub, k.queue.ev)
	}
}

func (m *modelRun) end(s mStep, how string) error {
	r, _, ok := pick(m.runsIn(runRunning), s.A)
	if !ok {
		return nil
	}
	return m.release(r, how, s.B%4 == 0)
}

func (m *modelRun) giveBack(s mStep) error {
	r, _, ok := pick(m.runsIn(runRunning, runWaiting), s.A)
	if !ok {
		return nil
	}
	return m.release(r, "giveback", s.B%4 == 0)
}

// crash abandons a run's lease: the worker is gone, its key expires by itself.
func (m *modelRun) crash(s mStep) error {
	r, _, ok := pick(m.runsIn(runRunning, runWaiting, runStale), s.A)
	if !ok {
		return nil
	}
	r.le.stopHeartbeat()
	m.removeRun(r)
	if r.state == runStale && r.why == "superseded" {
		r.state = runCrashed
		return m.terminal(r.ev, "cancelled")
	}
	r.state = runCrashed
	m.pending = append(m.pending, r)
	return nil
}

// expireKeys makes the server expire the keys a run held (its TTL passed on the
// server's clock), and waits until they are gone.
func (m *modelRun) expireKeys(r *mRun) error {
	all := append(r.le.lockInfoKeys(), r.le.apartKeys()...)
	var ks []string
	for i := 0; i+1 < len(all); i += 2 {
		if v, _ := m.direct.Get(m.ctx, all[i]).Result(); v == r.le.token {
			ks = append(ks, all[i], all[i+1]) // a key taken by force is another's now
		}
	}
	if len(ks) == 0 {
		return nil
	}
	for _, k := range ks {
		if err := m.direct.PExpire(m.ctx, k, time.Millisecond).Err(); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if n, err := m.direct.Exists(m.ctx, ks...).Result(); err != nil || n == 0 {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("keys %v did not expire", ks)
}

// expire: a crashed run's keys expire; its entry, still pending, is redelivered.
func (m *modelRun) expire(s mStep) error {
	r, i, ok := pick(m.pending, s.A)
	if !ok {
		return nil
	}
	m.pending = append(m.pending[:i], m.pending[i+1:]...)
	if err := m.freeKeysOf(r); err != nil {
		return err
	}
	r.ev.retried = true
	m.inbox = append(m.inbox, r.ev)
	return nil
}

func (m *modelRun) freeKeysOf(r *mRun) error {
	held := false
	for _, name := range r.keys {
		if m.key(name).holder == r {
			held = true
		}
	}
	if !held {
		return nil
	}
	if err := m.expireKeys(r); err != nil {
		return err
	}
	for _, name := range r.keys {
		if m.key(name).holder == r {
			m.key(name).holder = nil
		}
	}
	return nil
}

// clock: the server's clock runs ahead of the worker's by more than the lease has
// left: its keys expire while the worker still runs. Its writes must be refused.
func (m *modelRun) clock(s mStep) error {
	r, _, ok := pick(m.runsIn(runRunning), s.A)
	if !ok {
		return nil
	}
	if err := m.freeKeysOf(r); err != nil {
		return err
	}
	r.state, r.why = runStale, "clock"
	return nil
}

// force: an operator force-releases a run's own key.
func (m *modelRun) force(s mStep) error {
	r, _, ok := pick(m.runsIn(runRunning), s.A)
	if !ok || r.le.keys.Lock != m.l.LockKey(r.ev.agent, r.ev.issue) {
		return nil // ForceRelease names the agent's own key (not a Cluster key tagged by a shared one)
	}
	f, err := m.l.ForceRelease(m.ctx, r.ev.agent, r.ev.issue)
	if err != nil {
		return err
	}
	k := m.key(ownKey(r.ev))
	if f <= k.fence {
		return m.fail(propFence, "force release of %s: fence %d, not above the key's last fence %d", ownKey(r.ev), f, k.fence)
	}
	k.fence = f
	k.holder = nil
	r.state, r.why = runStale, "forced"
	return nil
}

// stale: a run whose key is no longer its own ends (its heartbeat or its next write
// told it): its release deletes nothing of the new holder's.
func (m *modelRun) stale(s mStep) error {
	r, _, ok := pick(m.runsIn(runStale), s.A)
	if !ok {
		return nil
	}
	if s.B%4 == 0 {
		m.loseNext(r.ev)
	}
	k := m.key(ownKey(r.ev))
	// With nobody holding the key, a draining release publishes the queue it finds.
	if k.holder == nil {
		m.mayDrain(k)
	}
	if _, err := r.le.Release(m.ctx); err != nil {
		return err
	}
	r.released, r.state = true, runDone
	m.removeRun(r)
	for _, name := range r.keys[1:] { // its shared keys were still its own
		if m.key(name).holder == r {
			m.key(name).holder = nil
		}
	}
	if r.why == "superseded" {
		return m.terminal(r.ev, "cancelled")
	}
	r.ev.retried = true
	m.inbox = append(m.inbox, r.ev)
	return nil
}

func (m *modelRun) do(s mStep) error {
	m.step++
	m.expPub, m.mayPub = nil, nil
	m.stepAt = append(m.stepAt, time.Now())
	switch s.Kind {
	case "new":
		_, err := m.newEvent(s, nil)
		return err
	case "deliver":
		return m.deliver(s)
	case "start":
		return m.start(s)
	case "end":
		return m.end(s, "ran")
	case "fail":
		return m.end(s, "fail")
	case "giveback":
		return m.giveBack(s)
	case "crash":
		return m.crash(s)
	case "expire":
		return m.expire(s)
	case "clock":
		return m.clock(s)
	case "force":
		return m.force(s)
	case "stale":
		return m.stale(s)
	case "batch":
		return m.batch(s)
	}
	return fmt.Errorf("unknown step %s", s.Kind)
}

// --- checks after every step ---

func (m *modelRun) check() error {
	if err := m.checkPublished(); err != nil {
		return err
	}
	if err := m.checkExclusive(); err != nil {
		return err
	}
	if err := m.ends.check(); err != nil {
		return err
	}
	return m.checkReal()
}

// endTally is an Observer that counts the leases acquired and their ends (the model's,
// and end_internal_test.go's).
type endTally struct{ acquired, released, lost atomic.Int64 }

func (o *endTally) Acquired(string)                 { o.acquired.Add(1) }
func (o *endTally) Busy(string)                     {}
func (o *endTally) Conflict(string, string, string) {}
func (o *endTally) Released(string, time.Duration)  { o.released.Add(1) }
func (o *endTally) Lost(string, error)              { o.lost.Add(1) }

// check: no lease ended twice in the counts (released and lost, or either twice): the
// ends counted never outnumber the leases acquired. A lease taken ahead and given back
// counts too. Ends are read before acquires, so that one counted meanwhile does not
// look like a double.
func (o *endTally) check() error {
	released, lost := o.released.Load(), o.lost.Load()
	if acquired := o.acquired.Load(); released+lost > acquired {
		return fmt.Errorf("property %s: %d leases acquired, %d ends counted (%d released, %d lost)",
			propEndedOnce, acquired, released+lost, released, lost)
	}
	return nil
}

// checkPublished compares the follow-ups that appeared in the stream with the model's.
func (m *modelRun) checkPublished() error {
	msgs, err := m.direct.XRange(m.ctx, m.stream, "("+m.lastIDOr0(), "+").Result()
	if err != nil {
		return err
	}
	want := map[int]int{}
	for _, ev := range m.expPub {
		want[ev.n]++
	}
	may := map[int]bool{}
	for _, ev := range m.mayPub {
		may[ev.n] = true
	}
	for _, msg := range msgs {
		m.lastID = msg.ID
		if _, ok := msg.Values["drv"]; ok {
			continue
		}
		n, _ := strconv.Atoi(fmt.Sprint(msg.Values["ev"]))
		if want[n] == 0 && !may[n] {
			return m.fail(propFollowup, "follow-up of event %d published (%s); the model expects %v", n, msg.ID, evNums(m.expPub))
		}
		if want[n] > 0 {
			want[n]--
		} else {
			delete(may, n)
			// A release the model let publish or not did: the queue went with it.
			for _, k := range m.keys {
				if k.queue != nil && k.queue.ev.n == n {
					k.queue, k.lastPub = nil, m.step
				}
			}
		}
		origin := m.events[n-1]
		fu := &mEvent{n: len(m.events) + 1, id: msg.ID, created: m.step}
		if _, err := m.newEventFrom(fu, origin); err != nil {
			return err
		}
	}
	for n, c := range want {
		if c > 0 {
			return m.fail(propStranded, "the queued follow-up of event %d was not published by the holder's release", n)
		}
	}
	return nil
}

func (m *modelRun) newEventFrom(fu, origin *mEvent) (*mEvent, error) {
	fu.agent, fu.issue, fu.group, fu.typ, fu.origin = origin.agent, origin.issue, origin.group, origin.typ, origin.n
	fu.stream = m.stream // a release publishes it to the queued event's stream
	m.add(fu)
	return fu, nil
}

func (m *modelRun) lastIDOr0() string {
	if m.lastID == "" {
		return "0-0"
	}
	return m.lastID
}

func evNums(evs []*mEvent) []int {
	out := []int{}
	for _, e := range evs {
		out = append(out, e.n)
	}
	return out
}

// checkExclusive: per guarded key, at most one run that runs (a waiting run has not
// started; a stale one still runs until it ends, and must be the key's only one
// unless the key expired under it by the clock, whose writes are refused instead).
func (m *modelRun) checkExclusive() error {
	running := map[string][]*mRun{}
	for _, r := range m.runs {
		if r.state == runRunning || (r.state == runStale && r.why == "superseded" && !r.waited) {
			for _, name := range r.keys {
				running[name] = append(running[name], r)
			}
		}
	}
	for name, rs := range running {
		if len(rs) > 1 {
			return m.fail(propExclusive, "%s: events %v run at once", name, runNums(rs))
		}
	}
	return nil
}

func runNums(rs []*mRun) []int {
	out := []int{}
	for _, r := range rs {
		out = append(out, r.ev.n)
	}
	return out
}

// checkReal compares the model's holders with the real keys and tries a fenced write
// as each stale run.
func (m *modelRun) checkReal() error {
	for _, r := range m.runs {
		if r.state == runWaiting || r.state == runRunning {
			v, _ := m.direct.Get(m.ctx, r.le.keys.Lock).Result()
			if v != r.le.token {
				return m.fail(propHolder, "event %d holds %s in the model; Redis holds %q", r.ev.n, r.le.keys.Lock, v)
			}
		}
		if r.state == runStale {
			if _, err := r.le.XAdd(m.ctx, m.stream+":w", 0, map[string]any{"ev": r.ev.n}); !errors.Is(err, ErrLeaseLost) {
				return m.fail(propStale, "event %d's run (%s) wrote under a lease no longer its own: %v", r.ev.n, r.why, err)
			}
		}
	}
	return nil
}

// settle ends everything: crashed keys expire, runs end, the inbox is delivered until
// empty; then nothing may be left queued and every event has exactly one record.
func (m *modelRun) settle() error {
	for round := 0; round < 200; round++ {
		var s mStep
		switch {
		case len(m.runsIn(runStale)) > 0:
			s = mStep{Kind: "stale", B: 1}
		case len(m.pending) > 0:
			s = mStep{Kind: "expire"}
		case len(m.runsIn(runRunning)) > 0:
			s = mStep{Kind: "end", B: 1}
		case len(m.runsIn(runWaiting)) > 0:
			s = mStep{Kind: "start"}
			time.Sleep(20 * time.Millisecond) // a crashed run's stop deadline is the TTL
		case len(m.inbox) > 0:
			s = mStep{Kind: "deliver", B: 1}
		default:
			return m.checkSettled()
		}
		if err := m.do(s); err != nil {
			return err
		}
		if err := m.check(); err != nil {
			return err
		}
	}
	return m.fail(propStranded, "did not settle in 200 rounds: inbox %v, runs %d", evNums(m.inbox), len(m.runs))
}

func (m *modelRun) checkSettled() error {
	for name, k := range m.keys {
		if k.queue != nil {
			return m.fail(propStranded, "%s: the follow-up of event %d is still queued with nobody to publish it", name, k.queue.ev.n)
		}
	}
	qs, err := m.direct.Keys(m.ctx, "lockqueue:*"+m.ns+"*").Result()
	if err != nil {
		return err
	}
	if len(qs) > 0 {
		return m.fail(propStranded, "queued follow-ups left in Redis: %v", qs)
	}
	for _, ev := range m.events {
		if ev.terminal == "" {
			return m.fail(propTerminal, "event %d ended with no record", ev.n)
		}
	}
	return nil
}

// --- the driver ---

type modelEnv struct {
	t      testing.TB
	direct *redis.Client
	proxy  *redistest.LossyProxy
	client *redis.Client
	// batches counts what the batch steps did, over every seed run here.
	batches batchStats
	// pauses counts what the pause model's batches did (model_pause_test.go).
	pauses pauseCov
}

func newModelEnv(t *testing.T) *modelEnv {
	direct, _ := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	return &modelEnv{t: t, direct: direct, proxy: proxy, client: proxy.Client(direct.Options())}
}

// runModel runs steps under cfg in a fresh namespace and returns the first violation.
func (e *modelEnv) runModel(cfg mConfig, steps []mStep) (err error) {
	ns := redistest.Namespace()
	defer redistest.DeleteNamespace(context.Background(), e.direct, ns)
	ends := &endTally{}
	l, err := New(e.client, Options{Scope: ns, TTL: time.Second, Format: cfg.Format, Observer: ends})
	if err != nil {
		return err
	}
	m := &modelRun{t: e.t, ends: ends, cfg: cfg, direct: e.direct, proxy: e.proxy, l: l, ns: ns, stream: "{" + ns + "s}",
		ctx: context.Background(), byID: map[string]*mEvent{}, keys: map[string]*mKey{},
		stepAt: []time.Time{time.Now()}, batches: &e.batches}
	defer func() {
		for _, r := range m.runs {
			r.le.stopHeartbeat()
		}
	}()
	for i, s := range steps {
		err := m.do(s)
		if err == nil {
			err = m.check()
		}
		if err != nil {
			return &stepError{at: i, err: err}
		}
	}
	return m.settle()
}

// stepError is a violation found at steps[at] (not while settling).
type stepError struct {
	at  int
	err error
}

func (e *stepError) Error() string { return e.err.Error() }

// shrink drops steps while the sequence still fails: the shortest failing one found.
func (e *modelEnv) shrink(cfg mConfig, steps []mStep, first error) ([]mStep, error) {
	last := first
	var se *stepError
	if errors.As(first, &se) {
		steps = steps[:se.at+1] // what came after the violation played no part in it
	}
	deadline := time.Now().Add(10 * time.Second) // a bound, not a timing assertion
	fails := func(try []mStep) bool {
		if time.Now().After(deadline) {
			return false
		}
		err := e.runModel(cfg, try)
		if err != nil && samePropery(err, first) {
			last = err
			return true
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		// Drop chunks, halving their size: long stretches go in a few tries.
		for size := len(steps) / 2; size >= 1; size /= 2 {
			for i := len(steps) - size; i >= 0; i -= size {
				try := append(append([]mStep{}, steps[:i]...), steps[i+size:]...)
				if fails(try) {
					steps, changed = try, true
				}
			}
		}
		for i := range steps {
			if steps[i].A == 0 && steps[i].B == 0 && steps[i].C == 0 {
				continue
			}
			try := append([]mStep{}, steps...)
			try[i].A, try[i].B, try[i].C = 0, 0, 0
			if fails(try) {
				steps, changed = try, true
			}
		}
	}
	return steps, last
}

func samePropery(a, b error) bool {
	pa, _, _ := strings.Cut(a.Error(), ":")
	pb, _, _ := strings.Cut(b.Error(), ":")
	return pa == pb
}

// checkSeeds runs seeds [from, from+n) and reports each property's first violation
// with its seed and shortest sequence.
func (e *modelEnv) checkSeeds(t *testing.T, from, n, length int, cfgFor func(*rand.Rand) mConfig, kinds []stepKind) {
	failed := map[string]bool{}
	for seed := from; seed < from+n; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 34))
		cfg := cfgFor(r)
		steps := genSteps(r, length, kinds)
		t0 := time.Now()
		err := e.runModel(cfg, steps)
		if testing.Verbose() {
			t.Logf("seed %d (%s): %s, %v", seed, cfg, time.Since(t0).Round(time.Millisecond), err)
		}
		if err == nil {
			continue
		}
		prop, _, _ := strings.Cut(err.Error(), ":")
		if failed[prop] {
			t.Logf("seed %d (%s) fails too: %v", seed, cfg, err)
			continue
		}
		failed[prop] = true
		short, serr := e.shrink(cfg, steps, err)
		t.Errorf("model checker: seed %d (%s) fails\n  %v\n  shortest sequence (%d of %d steps): %v\n  its failure: %v",
			seed, cfg, err, len(short), len(steps), short, serr)
	}
}

// TestModelLease runs seeded random sequences against the lease (MODEL_SEEDS=N for
// more; MODEL_SEED=S runs seed S alone).
func TestModelLease(t *testing.T) {
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 48)
	start := time.Now()
	e.checkSeeds(t, from, n, 60, genConfig, stepKinds)
	t.Logf("%d seeds of 60 steps in %s", n, time.Since(start).Round(time.Millisecond))
}

// TestModelLeaseTwin runs TestModelLease's seeds with every other new event in the
// stream's :todo twin, often with the id of the stream's last entry: an agent's worker
// reads both, and the lease tells their entries apart (the holder's own entry, the
// superseded check's exemption of the released entry's retry).
func TestModelLeaseTwin(t *testing.T) {
	e := newModelEnv(t)
	from, n := redistest.ModelSeeds(t, 24)
	start := time.Now()
	e.checkSeeds(t, from, n, 60, func(r *rand.Rand) mConfig {
		c := genConfig(r)
		c.Twin = true
		return c
	}, stepKinds)
	t.Logf("%d seeds of 60 steps in %s", n, time.Since(start).Round(time.Millisecond))
}

// TestModelLeaseStoppingRuns replays, at every run, the shortest sequences the checker
// found (at more seeds than it runs here) where an event under another rule than
// supersede ran beside a run still stopping after its take-over ended early: the
// take-over given back (TestModelLeaseBatch seed 195 of 200) or crashed and expired
// (TestModelLease seed 515 of 1 000). Each fails when a grant does not report the runs
// still stopping (granted_stopping).
func TestModelLeaseStoppingRuns(t *testing.T) {
	e := newModelEnv(t)
	seqs := []struct {
		cfg   mConfig
		steps string
	}{
		{mConfig{Format: KeysCompat, Scope: "agent", Table: map[string]string{"*": "delay", "a.x": "supersede"}},
			"new(0,0,0) new(33,39,20) new(0,0,0) deliver(0,0,0) new(0,0,0) new(0,0,0) deliver(0,0,0) new(7,7,46) deliver(0,0,0) giveback(5,21,53) new(46,48,57) deliver(52,42,14) deliver(51,48,46)"},
		{mConfig{Format: KeysCompat, Scope: "agent", Table: map[string]string{"*": "supersede", "a.x": "drop", "b.x": "coalesce"}},
			"new(35,6,42) new(0,0,0) deliver(0,0,0) new(59,16,50) deliver(0,0,0) deliver(0,0,0) new(9,12,1) crash(38,50,55) expire(0,0,0) deliver(0,0,0)"},
	}
	for i, s := range seqs {
		if err := e.runModel(s.cfg, parseSteps(t, s.steps)); err != nil {
			t.Errorf("sequence %d (%s): %v", i, s.cfg, err)
		}
	}
}

// parseSteps reads steps as the checker prints them: "kind(a,b,c)", space-separated.
func parseSteps(t *testing.T, s string) []mStep {
	t.Helper()
	var steps []mStep
	for _, f := range strings.Fields(s) {
		var st mStep
		kind, args, ok := strings.Cut(strings.TrimSuffix(f, ")"), "(")
		if _, err := fmt.Sscanf(args, "%d,%d,%d", &st.A, &st.B, &st.C); !ok || err != nil {
			t.Fatalf("step %q: %v", f, err)
		}
		st.Kind = kind
		steps = append(steps, st)
	}
	return steps
}
