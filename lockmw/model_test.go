package lockmw_test

// The middleware's model checker (issue 34): seeded random sequences of events of
// random types, issues and group values, under a random ON_CONFLICT table, LOCK_SCOPE
// and key format, run through lockmw's Handler on two workers per agent against the
// real Redis, with lost replies (go-redis sends again) and worker crashes (a worker's
// client and messages cut off between any two of its Redis calls: its leases are
// abandoned and expire, its entries stay pending, and a new worker takes its place).
// Runs end, fail or are superseded; each step is followed by the checks, and the end
// of a sequence by the settle checks (one terminal record per entry, nothing queued,
// stranded in a line or left pending: NothingPending). NoStaleHolder is checked on
// every conflict (record). In half the seeds the workers read ahead
// (mwReadAhead: Peek and Waiting over the inbox), mostly under a configuration whose
// quick runs end in batches (batch.go; the runs are made quick with SetBatchTiming):
// leases are taken ahead for entries that go to the other worker, out of order or
// late, and a crash can stop ends that wait for their batch (their entries are
// delivered again). model_plant_test.go checks that planted batch defects are caught.
// The lease's own model (lockmw/lease/model_test.go) covers clock offsets and force
// releases too. The seeds follow a few directed sequences (directedMW) that meet the
// batched hand-off whatever the timing. In half the seeds each agent's events enter its
// stream or its :todo twin (genTwin, genTwinAhead), whose entry ids repeat, and each
// worker has a middleware per stream, as it has a subscription per stream;
// TestModelMiddlewareSharedWait draws the wait policy under a shared scope, with ticks of
// the line waker; TestModelMiddlewareDeliver the deliver policy, whose runs read their
// mailboxes (DeliveredReachesARun). OwnIsTheHolders: an event's first handling is never
// left pending as the live holder's own entry. MODEL_SEEDS=N runs N seeds (default 48),
// MODEL_SEED=S from seed S; MODEL_TRACE=1 logs the steps and the batches.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// mwSource is a lockmw.Source over the real streams: the entry behind a message is in
// its metadata (as a subscription knows it), and Encode gives the fields that read back
// as the same message (a coalesced follow-up). Settle marks an entry that the
// subscriber must not ack itself; it acks every other one whose handler returned nil.
type mwSource struct {
	consumer string
	mu       sync.Mutex
	settled  map[string]bool // entryKey -> settled by the middleware
}

func (s *mwSource) Entry(msg *message.Message) (lockmw.Entry, bool) {
	return lockmw.Entry{Stream: msg.Metadata.Get("_stream"), Group: "g", Consumer: s.consumer, ID: msg.Metadata.Get("_id"),
		ReadAt: time.Now()}, true
}
func (s *mwSource) Settle(e lockmw.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled[e.Stream+"/"+e.ID] = true
}

// takeSettled reports whether the middleware settled entry id, and forgets it.
func (s *mwSource) takeSettled(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := s.settled[id]
	delete(s.settled, id)
	return ok
}

// mwReadAhead is mwSource with a subscription's read-ahead (the seeds drawn with
// readahead): the entries of its stream in the model's inbox, in inbox order,
// are the entries read and not handed over yet (Waiting), the first one the entry
// handed over next (Peek). The inbox is the agent's two workers', and the driver hands
// any of its entries to either worker: leases are taken ahead for entries that then go
// to the other worker, come out of the announced order, or come late (handoffWindow).
type mwReadAhead struct {
	*mwSource
	m      *mwModel
	stream string
}

func (s *mwReadAhead) Peek() (string, string, bool) {
	w := s.m.waiting(s.stream)
	if len(w) == 0 {
		return "", "", false
	}
	return w[0].ID, w[0].IssueKey, true
}

func (s *mwReadAhead) Waiting() []lockmw.Waiting { return s.m.waiting(s.stream) }
func (s *mwSource) Encode(msg *message.Message) (map[string]any, error) {
	md := map[string]string{}
	for k, v := range msg.Metadata {
		if !strings.HasPrefix(k, "_") && k != event.MetaFence {
			md[k] = v
		}
	}
	b, err := json.Marshal(md)
	return map[string]any{"md": string(b), "payload": string(msg.Payload)}, err
}

// mwMessage reads a stream entry back as the message the subscription hands over.
func mwMessage(stream string, m redis.XMessage) *message.Message {
	msg := message.NewMessage(m.ID, []byte(fmt.Sprint(m.Values["payload"])))
	var md map[string]string
	_ = json.Unmarshal([]byte(fmt.Sprint(m.Values["md"])), &md)
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set("_stream", stream)
	msg.Metadata.Set("_id", m.ID)
	return msg
}

type mwConfig struct {
	cluster  bool
	scope    string
	onConfl  string
	policies lockmw.Policies
	scopes   lease.Scopes
	// readahead: the workers' source is mwReadAhead (Peeker and Waiter), whose runs
	// shorter than quick end in batches that wait up to flush (SetBatchTiming).
	readahead    bool
	quick, flush time.Duration
	// slowSend: a batch that sends ends alone takes 3 ms more (countBatches).
	slowSend bool
	// issues is how many issues the events name (default 2; 4 with readahead, so that
	// more runs of one worker go on at once and end in one batch).
	issues int
	// otherConfl, when set, is the ON_CONFLICT of each agent's second worker, the first
	// keeping onConfl: a deployment in the middle of a rolling change of its rules.
	otherConfl string
	others     lockmw.Policies
	// twin: each agent's events enter its stream or its :todo twin (every other one),
	// whose entry ids repeat the stream's, as a worker reads both (genTwin).
	twin bool
	// slowStop: an agent slow to stop. A run cancelled by a newer event's take-over
	// goes on until its end step (or its worker's death), as an agent that finishes its
	// current step first; the newer run must not start before it stopped.
	slowStop bool
}

func (c mwConfig) String() string {
	f := "standalone"
	if c.cluster {
		f = "cluster"
	}
	s := fmt.Sprintf("format=%s LOCK_SCOPE=%s ON_CONFLICT=%s", f, c.scope, c.onConfl)
	if c.readahead {
		s += fmt.Sprintf(" readahead quick=%s flush=%s slowsend=%v", c.quick, c.flush, c.slowSend)
	}
	if c.otherConfl != "" {
		s += " second-worker ON_CONFLICT=" + c.otherConfl
	}
	if c.slowStop {
		s += " slow-stop"
	}
	if c.twin {
		s += " todo-twin"
	}
	return s
}

// genTwin draws, from its own generator, whether each agent's events enter two streams
// (its own and its :todo twin, as a worker reads both, a middleware per subscription):
// half the seeds that do not read ahead. genTwinAhead draws it for those that do.
func genTwin(r *rand.Rand, c *mwConfig) {
	c.twin = !c.readahead && r.IntN(2) == 0
}

// genTwinAhead draws, from a generator of its own (drawn after genTwin, so that the
// seeds that do not read ahead keep their configurations), the :todo twin for half the
// seeds that read ahead: each subscription's middleware takes leases ahead for the
// entries its own stream announces, and meets the other's.
func genTwinAhead(r *rand.Rand, c *mwConfig) {
	if c.readahead && r.IntN(2) == 0 {
		c.twin = true
	}
}

// genMixedRules draws, from a generator of its own (the seeds' configurations and steps
// stay those drawn before it existed), whether the agents' second workers run other
// rules than the first (a rolling change of ON_CONFLICT): in half the configurations
// with a supersede rule, theirs drop instead. A run superseded by the first worker's
// take-over, given back before it stopped, must not overlap an event of the second,
// whose rules never supersede.
//
// In half the configurations with a supersede rule, the agent is slow to stop
// (slowStop): without it, a superseded run stops at once, and nothing can overlap it.
func genMixedRules(r *rand.Rand, c *mwConfig) {
	if !c.policies.Uses(lockmw.Supersede) {
		return
	}
	c.slowStop = r.IntN(2) == 0
	if r.IntN(2) == 0 {
		return
	}
	c.otherConfl = strings.ReplaceAll(c.onConfl, "supersede", "drop")
	var err error
	if c.others, err = lockmw.ParsePolicies(c.otherConfl); err != nil {
		panic(err)
	}
}

var mwTypes = []string{"a.x", "b.x", "c.x"}

// parse sets c's policies and scopes from its ON_CONFLICT and LOCK_SCOPE, which the
// generators draw valid.
func (c *mwConfig) parse() {
	var err error
	if c.policies, err = lockmw.ParsePolicies(c.onConfl); err != nil {
		panic(err)
	}
	if c.scopes, err = lease.ParseScopes(c.scope); err != nil {
		panic(err)
	}
}

// genMWConfig draws a configuration the middleware accepts.
func genMWConfig(r *rand.Rand) mwConfig {
	pols := []string{"drop", "coalesce", "deliver", "supersede", "delay:10s", "wait", "wait:2"}
	for {
		c := mwConfig{cluster: r.IntN(2) == 1, scope: []string{"agent", "issue", "group:m:grp"}[r.IntN(3)]}
		parts := []string{}
		for _, t := range mwTypes[:r.IntN(3)] {
			parts = append(parts, t+"="+pols[r.IntN(len(pols))])
		}
		c.onConfl = strings.Join(append(parts, "*="+pols[r.IntN(len(pols))]), ",")
		c.parse()
		if c.scopes.Shared() && (c.policies.Uses(lockmw.Coalesce, lockmw.Deliver, lockmw.Supersede)) {
			continue // refused by NewMiddleware
		}
		if c.scopes.Shared() && c.policies.Uses(lockmw.Wait) {
			// Accepted, but skipped here so that every seed keeps the configuration it
			// has drawn since: TestModelMiddlewareSharedWait draws these.
			continue
		}
		if c.policies.Uses(lockmw.Wait) && c.policies.Uses(lockmw.Coalesce, lockmw.Deliver, lockmw.Supersede) {
			continue // refused by NewMiddleware
		}
		return c
	}
}

// genReadAhead draws, from a generator of its own (the seeds' configurations and steps
// stay those drawn before it existed), whether c's workers read ahead (half the seeds)
// and, for most of those, a configuration whose quick runs end in batches (standalone
// keys, scope agent, drop and delay only): the random configurations are rarely one.
//
// It also turns some of steps into the read-ahead's own: next (the entry announced
// next goes to a worker, whose lease taken ahead is then used), burst (every started
// run of one worker ends, one after the other: quick ends that wait for one batch)
// and endcrash (a run ends and its worker crashes at once, its end often waiting).
func genReadAhead(r *rand.Rand, c *mwConfig, steps []mwStep) {
	if r.IntN(2) == 0 {
		return
	}
	c.readahead = true
	c.issues = 4
	c.quick = []time.Duration{0, 3 * time.Millisecond, time.Hour, time.Hour}[r.IntN(4)]
	c.flush = []time.Duration{time.Millisecond, 30 * time.Millisecond}[r.IntN(2)]
	c.slowSend = r.IntN(2) == 0
	for i := range steps {
		switch {
		case steps[i].Kind == "deliver" && r.IntN(2) == 0:
			steps[i].Kind = "next"
		case r.IntN(10) == 0:
			steps[i].Kind = "burst"
		case r.IntN(20) == 0:
			steps[i].Kind = "endcrash"
		}
	}
	if r.IntN(4) == 0 {
		return // any configuration: the single hand-off, the supersede watch of Waiting
	}
	pols := []string{"drop", "delay:10s"}
	parts := []string{}
	for _, t := range mwTypes[:r.IntN(3)] {
		parts = append(parts, t+"="+pols[r.IntN(2)])
	}
	c.cluster, c.scope, c.onConfl = false, "agent", strings.Join(append(parts, "*="+pols[r.IntN(2)]), ",")
	c.parse()
}

type mwStep struct {
	Kind    string
	A, B, C int
}

func (s mwStep) String() string { return fmt.Sprintf("%s(%d,%d,%d)", s.Kind, s.A, s.B, s.C) }

func genMWSteps(r *rand.Rand, n int) []mwStep {
	kinds := []string{"new", "new", "new", "deliver", "deliver", "deliver", "deliver", "end", "end", "end", "fail", "lose", "crash"}
	out := make([]mwStep, n)
	for i := range out {
		out[i] = mwStep{Kind: kinds[r.IntN(len(kinds))], A: r.IntN(64), B: r.IntN(64), C: r.IntN(64)}
	}
	return out
}

// mwRun is one handling of one entry: the handler's call and, once it starts, the run.
type mwRun struct {
	id       string
	msg      *message.Message
	started  chan struct{}
	done     chan struct{}
	ctl      chan bool // true: the run succeeds, false: it fails
	err      error
	ran      bool // the handler's function ran to success
	isStart  bool
	finished bool
	worker   *mwWorker    // the worker handling it
	lease    *lease.Lease // the lease it ran under (EndedByRelease)
}

// mwEnded is where and when a run ended (its work returned nil).
type mwEnded struct {
	owner string
	at    time.Time
}

type mwModel struct {
	t       testing.TB
	nacked  map[*message.Message]bool // inbox messages a failed run handed back (the reader's Nack)
	cfg     mwConfig
	direct  *redis.Client
	client  *redis.Client
	proxy   *redistest.LossyProxy
	srv     *redistest.Server
	replica *redistest.Server
	lagging bool
	ns      string
	ctx     context.Context
	unruns  *atomic.Int64          // mwEnv's batches.unrun
	workers map[string][]*mwWorker // agent -> its two workers
	results string
	// newWorker starts the worker of agent in slot w (generation gen: its Owner).
	newWorker func(agent string, w, gen int) (*mwWorker, error)

	mu      sync.Mutex
	byID    map[string]*mwRun  // entry id -> its handling under way
	running map[string]string  // guarded key -> entry id of the run on it
	fences  map[string]int64   // the agent's own key -> the last fence a run got
	endedOn map[string]mwEnded // entry id -> its last successful run's worker and end
	// mailRead are the entries whose follow-up a successful run read from its lease's
	// mailbox and accounted for (deliver policy: DeliveredReachesARun).
	mailRead map[string]bool
	violated error

	step  int
	inbox []*message.Message
	// ahead is the inbox's entries of each stream, in order, for mwReadAhead
	// (handlers read it while the driver changes the inbox); publishInbox updates it.
	aheadMu sync.Mutex
	ahead   map[string][]lockmw.Waiting
	runs    []*mwRun
	seen    map[string]bool // entries read from the streams
	ran     map[string]int  // entry id -> successful runs
	// ranOrder are the entries that ran, in the order they ran; lidOf the wait
	// policy's line id of each entry read (its waited_from, else itself).
	ranOrder []string
	lidOf    map[string]string
	tries    map[string]int
}

func (m *mwModel) stream(agent string) string { return "{" + m.ns + agent + "}:s" }

// streams are the streams agent's workers read: its own, and its :todo twin (twin).
func (m *mwModel) streams(agent string) []string {
	if m.cfg.twin {
		return []string{m.stream(agent), m.stream(agent) + ":todo"}
	}
	return []string{m.stream(agent)}
}

// publishInbox tells the read-ahead sources the inbox as it is now. Call it after every
// change of the inbox.
func (m *mwModel) publishInbox() {
	ahead := map[string][]lockmw.Waiting{}
	for _, msg := range m.inbox {
		a := msg.Metadata.Get("_stream")
		ahead[a] = append(ahead[a], lockmw.Waiting{ID: msg.Metadata.Get("_id"), IssueKey: msg.Metadata.Get(event.MetaIssueKey),
			EventType: msg.Metadata.Get("event_type")})
	}
	m.aheadMu.Lock()
	defer m.aheadMu.Unlock()
	m.ahead = ahead
}

// waiting is a subscription's read-ahead: its stream's entries in the inbox, in order.
func (m *mwModel) waiting(stream string) []lockmw.Waiting {
	m.aheadMu.Lock()
	defer m.aheadMu.Unlock()
	return append([]lockmw.Waiting(nil), m.ahead[stream]...)
}

func (m *mwModel) violate(prop, format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.violated == nil {
		m.violated = fmt.Errorf("property %s: step %d: %s", prop, m.step, fmt.Sprintf(format, args...))
	}
}

// guarded are the keys a run of msg holds, by name: the agent's own, the issue's, the group's.
func (m *mwModel) guarded(agent string, msg *message.Message) []string {
	issue := msg.Metadata.Get(event.MetaIssueKey)
	keys := []string{agent + ":" + issue}
	if m.cfg.scopes.Issue {
		keys = append(keys, "@issue:"+issue)
	}
	if len(m.cfg.scopes.Group) > 0 {
		keys = append(keys, "@group:"+msg.Metadata.Get("grp"))
	}
	return keys
}

// handler is the work: it claims the guarded keys (Exclusive), checks the fence
// (FenceIncreases) and waits for the driver's verdict or its context's end.
func (m *mwModel) handler(agent string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id := entryKey(msg)
		m.mu.Lock()
		run := m.byID[id]
		m.mu.Unlock()
		keys := m.guarded(agent, msg)
		fence, _ := strconv.ParseInt(msg.Metadata.Get(event.MetaFence), 10, 64)
		m.mu.Lock()
		for _, k := range keys {
			if other, busy := m.running[k]; busy {
				m.mu.Unlock()
				m.violate("Exclusive", "%s: entry %s runs while entry %s runs", k, id, other)
				m.mu.Lock()
			}
			m.running[k] = id
		}
		if last := m.fences[keys[0]]; fence <= last {
			m.mu.Unlock()
			m.violate("FenceIncreases", "%s: entry %s runs with fence %d after a run with fence %d", keys[0], id, fence, last)
			m.mu.Lock()
		}
		m.fences[keys[0]] = max(m.fences[keys[0]], fence)
		m.mu.Unlock()
		run.lease, _ = lockmw.LeaseFrom(msg.Context())
		close(run.started)
		var err error
		select {
		case ok := <-run.ctl:
			if !ok {
				err = errors.New("the run failed")
			}
		case <-msg.Context().Done():
			err = context.Cause(msg.Context())
			if m.cfg.slowStop && errors.Is(err, lockmw.ErrSuperseded) {
				select { // it stops at its end step, or when its worker dies
				case <-run.ctl:
				case <-run.worker.ctx.Done():
				}
			}
		}
		if err == nil && run.lease != nil && m.cfg.policies.Uses(lockmw.Deliver) {
			err = m.readMailbox(msg.Context(), run.lease)
		}
		m.mu.Lock()
		for _, k := range keys {
			if m.running[k] == id {
				delete(m.running, k)
			}
		}
		if err == nil {
			m.endedOn[id] = mwEnded{owner: run.worker.owner, at: time.Now()}
		}
		m.mu.Unlock()
		run.ran = err == nil
		return nil, err
	}
}

// readMailbox is a run's part of the deliver policy, at its end: it reads the
// follow-ups in its lease's mailbox and accounts for them (MailboxDone), as the
// handlers' closeMailbox does; once both succeed they count as read (mailRead). A
// failure fails the run: its retry, or the issue's next run, reads them again.
func (m *mwModel) readMailbox(ctx context.Context, le *lease.Lease) error {
	fs, err := le.Mailbox(ctx, "", 0)
	if err != nil || len(fs) == 0 {
		return err
	}
	ids := make([]string, len(fs))
	for i, f := range fs {
		ids[i] = f.ID
	}
	if _, err := le.MailboxDone(ctx, ids...); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range fs {
		m.mailRead[f.Fields["stream"]+"/"+f.Fields["message_id"]] = true
	}
	return nil
}

// mwWorker is one worker: its own client (so a crash cuts off its calls alone), and the
// context its messages carry (a crash ends them, as the process's death would).
type mwWorker struct {
	client   *redis.Client
	owner    string
	gen      int
	mws      []*lockmw.Middleware           // one per stream its agent reads
	handlers map[string]message.HandlerFunc // by stream: its middleware's Handler
	src      *mwSource
	ctx      context.Context
	cancel   context.CancelFunc
	// ranRuns are its runs that ran (counted in ran): a crash un-counts those whose
	// entry is still pending (their end waited for a batch the crash stopped).
	ranRuns []*mwRun
}

// crash kills a worker between two of its Redis calls: after a short random moment
// (A: 0 to 7 ms) its client is closed and its messages' context cancelled, whatever
// it was doing (acquiring, waiting, running, releasing, acking). Its handlers return
// (their entries stay pending: the inbox gets them again), its leases are abandoned
// and expire (made to expire at once here, the TTL passing: no call of the dead
// worker can reach Redis any more), and a new worker takes its slot.
func (m *mwModel) crash(s mwStep) error {
	agent := []string{"ag1", "ag2"}[s.B%2]
	slot := s.C % 2
	wk := m.workers[agent][slot]
	time.Sleep(time.Duration(s.A%8) * time.Millisecond)
	_ = wk.client.Close()
	wk.cancel()
	if os.Getenv("MODEL_TRACE") != "" {
		m.t.Logf("step %d: crash %s", m.step, wk.owner)
	}
	// Its handlers return at once: their context is the dead process's.
	for _, r := range append([]*mwRun{}, m.runs...) {
		if r.worker == wk {
			select {
			case <-r.done:
			case <-time.After(5 * time.Second):
				return fmt.Errorf("a crashed worker's handler of %s did not return", r.id)
			}
			m.finish(r)
		}
	}
	if err := m.expireLeasesOf(wk.owner); err != nil {
		return err
	}
	// A run that ended and whose entry is still pending: its end waited for a batch
	// (or for the subscriber's ack) that the crash stopped. Its release never happened,
	// as after a SIGKILL between a run's end and its release: the lease expires, the
	// subscription delivers the entry again, and it may run again (at least once).
	// That run no longer counts.
	for _, r := range wk.ranRuns {
		if m.pending(r.msg) {
			m.unrun(r)
			m.unruns.Add(1)
		}
	}
	next, err := m.newWorker(agent, slot, wk.gen+1)
	if err != nil {
		return err
	}
	m.workers[agent][slot] = next
	return nil
}

// unrun forgets a run of r's entry whose end was never sent, and puts the entry back
// in the inbox.
func (m *mwModel) unrun(r *mwRun) {
	if os.Getenv("MODEL_TRACE") != "" {
		m.t.Logf("step %d: entry %s ran, its end was not sent before the crash: delivered again", m.step, r.id)
	}
	if m.ran[r.id]--; m.ran[r.id] == 0 {
		delete(m.ran, r.id)
	}
	for i := len(m.ranOrder) - 1; i >= 0; i-- {
		if m.ranOrder[i] == r.id {
			m.ranOrder = append(m.ranOrder[:i], m.ranOrder[i+1:]...)
			break
		}
	}
	m.inbox = append(m.inbox, r.msg)
	m.publishInbox()
}

// expireLeasesOf makes the server expire every lease key (own or shared) whose record
// names owner and whose lock still holds that record's token.
func (m *mwModel) expireLeasesOf(owner string) error {
	infos, err := m.direct.Keys(m.ctx, "lockinfo:*"+m.ns+"*").Result()
	if err != nil {
		return err
	}
	for _, info := range infos {
		h, err := m.direct.HMGet(m.ctx, info, "owner", "token").Result()
		if err != nil || len(h) < 2 || h[0] != owner {
			continue
		}
		lock := "lock:" + strings.TrimPrefix(info, "lockinfo:")
		if m.direct.Get(m.ctx, lock).Val() != h[1] {
			continue
		}
		if err := m.direct.Del(m.ctx, lock, info).Err(); err != nil {
			return err
		}
	}
	return nil
}

// read takes the new entries of every agent's streams (events and published
// follow-ups) into the inbox.
func (m *mwModel) read() error {
	for _, stream := range append(m.streams("ag1"), m.streams("ag2")...) {
		res, err := m.direct.XReadGroup(m.ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"},
			Count: 100, Block: -1}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return err
		}
		for _, s := range res {
			for _, msg := range s.Messages {
				if os.Getenv("MODEL_TRACE") != "" {
					m.t.Logf("step %d: read %s %v", m.step, msg.ID, msg.Values)
				}
				m.seen[s.Stream+"/"+msg.ID] = true
				mm := mwMessage(s.Stream, msg)
				m.lidOf[s.Stream+"/"+msg.ID] = s.Stream + "/" + msg.ID
				if from := mm.Metadata.Get(lockmw.MetaWaitedFrom); from != "" {
					m.lidOf[s.Stream+"/"+msg.ID] = s.Stream + "/" + from
				}
				m.inbox = append(m.inbox, mm)
			}
		}
	}
	m.publishInbox()
	return nil
}

func (m *mwModel) newEvent(s mwStep) error {
	agent := []string{"ag1", "ag2"}[s.A%2]
	md := map[string]string{event.MetaIssueKey: "P-" + strconv.Itoa(1+s.B%max(m.cfg.issues, 2)), "grp": []string{"G1", "G2"}[s.C%2],
		"event_type": mwTypes[(s.A/2)%3]}
	b, _ := json.Marshal(md)
	streams := m.streams(agent)
	stream := streams[(s.C/2)%len(streams)]
	values := map[string]any{"md": string(b), "payload": "{}"}
	if stream != streams[0] {
		// The twin's event enters in the millisecond of the stream's last one, as two
		// producers' events do: its id is often that entry's id.
		last, err := m.direct.XRevRangeN(m.ctx, streams[0], "+", "-", 1).Result()
		if err == nil && len(last) == 1 {
			ms, _, _ := strings.Cut(last[0].ID, "-")
			if m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: stream, ID: ms + "-*", Values: values}).Err() == nil {
				return nil
			}
		}
	}
	return m.direct.XAdd(m.ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err()
}

// entryKey names msg's entry: stream ids repeat across streams.
func entryKey(msg *message.Message) string {
	return msg.Metadata.Get("_stream") + "/" + msg.Metadata.Get("_id")
}

func agentOf(msg *message.Message) string {
	s := msg.Metadata.Get("_stream")
	s = s[:strings.LastIndex(s, "}")] // "{<ns><agent>}:s", or its ":todo" twin
	return s[len(s)-3:]
}

// deliver hands an inbox entry to a worker and waits until its run started, the
// handler returned, or (a take-over waiting for the run it superseded) a while.
func (m *mwModel) deliver(s mwStep) {
	if len(m.inbox) == 0 {
		return
	}
	i := s.A % len(m.inbox)
	msg := m.inbox[i]
	m.inbox = append(m.inbox[:i], m.inbox[i+1:]...)
	m.publishInbox()
	id := entryKey(msg)
	if m.nacked[msg] {
		delete(m.nacked, msg)
		// Its reader hands a nacked message over again only while its entry is pending
		// (subscriber stillOurs): another copy may have ended it meanwhile.
		if !m.pending(msg) {
			if os.Getenv("MODEL_TRACE") != "" {
				m.t.Logf("step %d: nacked %s no longer pending: not handed over again", m.step, id)
			}
			return
		}
	}
	m.tries[id]++
	if os.Getenv("MODEL_TRACE") != "" {
		m.t.Logf("step %d: deliver %s (%s %s %s) to worker %d", m.step, id, agentOf(msg), msg.Metadata.Get("issue_key"), msg.Metadata.Get("event_type"), s.B%2)
	}
	run := &mwRun{id: id, msg: msg, started: make(chan struct{}), done: make(chan struct{}), ctl: make(chan bool, 1),
		worker: m.workers[agentOf(msg)][s.B%2]}
	m.runs = append(m.runs, run)
	m.mu.Lock()
	m.byID[id] = run
	m.mu.Unlock()
	wk := m.workers[agentOf(msg)][s.B%2]
	h := wk.handlers[msg.Metadata.Get("_stream")]
	cp := msg.Copy()
	// Each message has a context of its own, which its reader ends once the handler
	// has acked or nacked it (subscriber deliver), as the worker's end would.
	mctx, acked := context.WithCancel(wk.ctx)
	cp.SetContext(mctx)
	go func() {
		defer close(run.done)
		_, run.err = h(cp)
		acked()
		if settled := wk.src.takeSettled(id); run.err == nil && !settled {
			// The subscriber's own XACK (through the worker's client: a crash stops it).
			_ = wk.client.XAck(context.Background(), msg.Metadata.Get("_stream"), "g", msg.Metadata.Get("_id")).Err()
		}
	}()
	select {
	case <-run.started:
		run.isStart = true
	case <-run.done:
		m.finish(run)
	case <-time.After(300 * time.Millisecond):
	}
}

// finish accounts for a handler that returned: a success is a run, an error leaves the
// entry pending, to be delivered again.
func (m *mwModel) finish(run *mwRun) {
	if run.finished {
		return
	}
	run.finished = true
	if os.Getenv("MODEL_TRACE") != "" {
		m.t.Logf("step %d: entry %s handled: ran=%v err=%v", m.step, run.id, run.ran, run.err)
	}
	for i, r := range m.runs {
		if r == run {
			m.runs = append(m.runs[:i], m.runs[i+1:]...)
			break
		}
	}
	if run.err == nil && run.ran {
		m.ran[run.id]++
		m.ranOrder = append(m.ranOrder, run.id)
		run.worker.ranRuns = append(run.worker.ranRuns, run)
		return
	}
	if run.err == nil && !m.pending(run.msg) {
		return // acked: it has its record
	}
	if run.err == nil {
		m.checkOwn(run)
	}
	// Still pending (an error, or the entry of a live lease whose acquire's reply was
	// lost: it runs once that lease expires): the subscription delivers it again.
	m.inbox = append(m.inbox, run.msg)
	if run.err != nil {
		m.nacked[run.msg] = true
	}
	m.publishInbox()
}

// checkOwn checks a handling that left its entry pending without an error: the
// middleware took it for the live holder's own entry (LockedError.Own: a copy of the
// entry whose lease lives on, its acquire's reply lost or its worker gone). That lease
// was taken by an earlier handling of the same event (the entry, or a copy of it in
// the wait policy's line: one line id), so the event's first handling is never its
// holder's own (OwnIsTheHolders): an entry of the :todo twin with the id of the
// holder's entry in the stream is another event. Not checked when the workers read
// ahead: a lease is taken ahead for an entry before its handling.
func (m *mwModel) checkOwn(run *mwRun) {
	if m.cfg.readahead {
		return
	}
	lid, before := m.lidOf[run.id], -1 // this handling is counted in tries
	for id, n := range m.tries {
		if m.lidOf[id] == lid {
			before += n
		}
	}
	if before == 0 {
		m.violate("OwnIsTheHolders", "entry %s, handled for the first time, was left pending as the live holder's own entry", run.id)
	}
}

// pending reports whether msg's entry is still pending (not acked).
func (m *mwModel) pending(msg *message.Message) bool {
	id := msg.Metadata.Get("_id")
	p, err := m.direct.XPendingExt(m.ctx, &redis.XPendingExtArgs{Stream: msg.Metadata.Get("_stream"), Group: "g", Start: id, End: id, Count: 1}).Result()
	return err == nil && len(p) == 1
}

// deliverNext hands the first inbox entry of agent A's stream, the one its read-ahead
// announces (Peek), to its worker B.
func (m *mwModel) deliverNext(s mwStep) {
	agent := []string{"ag1", "ag2"}[s.A%2]
	for i, msg := range m.inbox {
		if agentOf(msg) == agent {
			m.deliver(mwStep{Kind: "deliver", A: i, B: s.B})
			return
		}
	}
}

// burst ends every started run of one worker (agent A, slot B) one after the other,
// all successes but the first, which fails when C is odd: quick ends that wait for
// one batch.
func (m *mwModel) burst(s mwStep) {
	wk := m.workers[[]string{"ag1", "ag2"}[s.A%2]][s.B%2]
	first := true
	for _, r := range append([]*mwRun{}, m.runs...) {
		if r.worker == wk && r.isStart && !r.finished {
			r.ctl <- !first || s.C%2 == 0
			first = false
			<-r.done
			m.finish(r)
		}
	}
}

// endCrash ends a started run (A) and crashes its worker right after: its end may
// still wait for its batch.
func (m *mwModel) endCrash(s mwStep) error {
	r := m.end(s, true)
	if r == nil {
		return nil
	}
	for a, agent := range []string{"ag1", "ag2"} {
		for slot, wk := range m.workers[agent] {
			if wk == r.worker {
				return m.crash(mwStep{Kind: "crash", A: 0, B: a, C: slot})
			}
		}
	}
	return nil // its worker crashed already
}

func (m *mwModel) end(s mwStep, ok bool) *mwRun {
	var started []*mwRun
	for _, r := range m.runs {
		if r.isStart {
			started = append(started, r)
		}
	}
	if len(started) == 0 {
		return nil
	}
	r := started[s.A%len(started)]
	r.ctl <- ok
	<-r.done
	m.finish(r)
	return r
}

// poll notices runs that started or ended by themselves (superseded, or a take-over
// whose wait is over).
func (m *mwModel) poll() {
	for _, r := range append([]*mwRun{}, m.runs...) {
		select {
		case <-r.done:
			m.finish(r)
			continue
		default:
		}
		select {
		case <-r.started:
			r.isStart = true
		default:
		}
	}
}

func (m *mwModel) do(s mwStep) error {
	m.step++
	switch s.Kind {
	case "new":
		if err := m.newEvent(s); err != nil {
			return err
		}
	case "deliver":
		m.deliver(s)
	case "end":
		m.end(s, true)
	case "next":
		m.deliverNext(s)
	case "burst":
		m.burst(s)
	case "endcrash":
		if err := m.endCrash(s); err != nil {
			return err
		}
	case "fail":
		m.end(s, false)
	case "tick":
		// The next entry enters in a later millisecond than what came before: after it,
		// to the stream's clock (its ids are in milliseconds).
		time.Sleep(time.Until(time.UnixMilli(time.Now().UnixMilli() + 2)))
	case "sweep":
		m.sweepLines()
	case "lose":
		m.proxy.LoseReply(redistest.Any(redistest.Command("evalsha", m.ns), redistest.Command("eval", m.ns)), 1)
	case "crash":
		if err := m.crash(s); err != nil {
			return err
		}
	case "lag":
		// The replica stops acknowledging (SIGSTOP): acquires are refused and given back
		// (or not taken at all), extends do not count; a lease left unconfirmed for its
		// TTL minus the margin ends under its run.
		if m.replica != nil && !m.lagging {
			m.replica.Pause()
			m.lagging = true
		}
	case "catchup":
		if m.replica != nil && m.lagging {
			m.replica.Resume()
			m.lagging = false
		}
	case "restart":
		// The server dies (SIGKILL) and comes back from its AOF (appendfsync always, as
		// REQUIRE_AOF asks of a deployment) while the workers go on: whatever they send
		// meanwhile fails or is sent again; nothing acknowledged is lost.
		if m.srv != nil {
			m.srv.Restart()
		}
	}
	m.poll()
	if err := m.read(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.violated
}

// settle ends every run and delivers every entry until nothing is left, then checks
// that every entry has exactly one record and nothing is queued or pending.
func (m *mwModel) settle() error {
	if err := m.do(mwStep{Kind: "catchup"}); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	// Only a shared key's line is left stranded by design; an agent's line that is
	// must have lost a wake-up (NothingStranded), which the waker would hide.
	swept, waits := 0, m.cfg.policies.Uses(lockmw.Wait) && m.cfg.scopes.Shared()
	for i := 1; time.Now().Before(deadline); i++ {
		var s mwStep
		switch {
		case waits && i%25 == 0:
			// The line waker ticks whatever else goes on (RunLineWaker): a line left
			// stranded by design (under a shared scope, a turn given up to a held agent
			// key) moves only then, and an event refused by its full line comes back
			// until it has.
			s = mwStep{Kind: "sweep"}
		case len(m.runs) > 0 && m.anyStarted():
			s = mwStep{Kind: "end"}
		case len(m.runs) > 0:
			time.Sleep(20 * time.Millisecond) // a take-over waits for the run it superseded
			s = mwStep{Kind: "poll"}
		case len(m.inbox) > 0:
			time.Sleep(2 * time.Millisecond) // an entry may wait for an orphaned lease's TTL
			s = mwStep{Kind: "deliver"}
		case waits && swept < 3:
			// Nothing else moves: the line waker's next ticks.
			swept++
			s = mwStep{Kind: "sweep"}
		default:
			return m.checkSettled()
		}
		if err := m.do(s); err != nil {
			return err
		}
	}
	return fmt.Errorf("property NothingStranded: did not settle: inbox %d, runs %d", len(m.inbox), len(m.runs))
}

func (m *mwModel) anyStarted() bool {
	for _, r := range m.runs {
		if r.isStart {
			return true
		}
	}
	return false
}

// sweepLines ticks the line waker of every live worker that waits (RunLineWaker's
// sweep), as each worker's own ticker would. A sweep that fails (its replies lost) is
// only traced: the waker logs it and its next tick tries again.
func (m *mwModel) sweepLines() {
	for _, agent := range []string{"ag1", "ag2"} {
		for _, wk := range m.workers[agent] {
			for _, mw := range wk.mws {
				if !mw.Waits() {
					continue
				}
				if err := mw.SweepLines(wk.ctx); err != nil && os.Getenv("MODEL_TRACE") != "" {
					m.t.Logf("step %d: the line waker of %s failed: %v", m.step, wk.owner, err)
				}
			}
		}
	}
}

func (m *mwModel) checkSettled() error {
	recs, err := m.direct.XRange(m.ctx, m.results, "-", "+").Result()
	if err != nil {
		return err
	}
	count := map[string][]string{}
	for id, n := range m.ran {
		for range n {
			count[id] = append(count[id], "ran")
		}
	}
	for _, r := range recs {
		id := fmt.Sprint(r.Values["id"])
		count[id] = append(count[id], fmt.Sprint(r.Values["outcome"]))
	}
	ids := make([]string, 0, len(m.seen))
	for id := range m.seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if len(count[id]) != 1 {
			return fmt.Errorf("property OneTerminalRecord: entry %s ended with records %v", id, count[id])
		}
		// A follow-up delivered to a run's mailbox is read by a run: its record alone
		// does not say that it reached one.
		if count[id][0] == "delivered" && !m.mailRead[id] {
			return fmt.Errorf("property DeliveredReachesARun: entry %s was recorded delivered; no run read it from a mailbox", id)
		}
	}
	if err := m.checkLines(recs); err != nil {
		return err
	}
	if err := m.checkAcked(); err != nil {
		return err
	}
	if err := m.checkEndedByRelease(); err != nil {
		return err
	}
	qs, err := m.direct.Keys(m.ctx, "lockqueue:*"+m.ns+"*").Result()
	if err != nil {
		return err
	}
	if len(qs) > 0 {
		return fmt.Errorf("property NothingStranded: queued follow-ups left with nobody to publish them: %v", qs)
	}
	return nil
}

// checkAcked checks that every entry read is acked once the ends that wait for a batch
// have been sent (NothingPending; they wait up to the flush time): an entry left
// pending would be claimed and run again by another consumer, though it ran or has its
// record.
func (m *mwModel) checkAcked() error {
	var left []string
	deadline := time.Now().Add(time.Second + m.cfg.flush)
	for {
		left = left[:0]
		for _, stream := range append(m.streams("ag1"), m.streams("ag2")...) {
			p, err := m.direct.XPendingExt(m.ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 100}).Result()
			if err != nil {
				return err
			}
			for _, e := range p {
				left = append(left, stream+"/"+e.ID)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("property NothingPending: entries left pending, never to be acked: %v", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkEndedByRelease checks that the lease of every run that ran on a live worker
// ended through its release (or a loss, or a newer event superseding it), never
// through the end of its message's context: its reader ends that context once the
// handler has acked, and an end that waits for a batch is released after that. A
// crashed worker's leases end with its context: they are not checked.
func (m *mwModel) checkEndedByRelease() error {
	for _, agent := range []string{"ag1", "ag2"} {
		for _, wk := range m.workers[agent] {
			for _, r := range wk.ranRuns {
				if r.lease == nil {
					continue
				}
				// Released, the batch's XACK landed first: the lease's context ends just after.
				redistest.Within(time.Second, func() bool { return r.lease.Context().Err() != nil })
				cause := context.Cause(r.lease.Context())
				if cause == nil {
					return fmt.Errorf("property EndedByRelease: entry %s ran on live worker %s; its lease never ended", r.id, wk.owner)
				}
				if errors.Is(cause, context.Canceled) {
					return fmt.Errorf("property EndedByRelease: entry %s ran on live worker %s; its lease ended with %w, not by its release", r.id, wk.owner, cause)
				}
			}
		}
	}
	return nil
}

// record is the conflict recorder: one record per entry that did not run, idempotent
// per entry as the pipeline's is (a record whose ack was lost with a crashed worker
// is written again by the entry's redelivery, and must not count twice).
//
// It also checks NoStaleHolder: a worker never finds its issue held by a run that
// ended on that same worker before the event entered its stream. That run's end was
// sent (handler done, or waiting ends sent first, sendWithEntry) or is taken in the
// same batch as the event's lease, after its release; an event that entered before
// that run ended may meet it (the superseded rule drops it either way).
func (m *mwModel) record(ctx context.Context, pipe redis.Pipeliner, c lockmw.Conflict) {
	// The holder's agent is the event's: its entry is in the same stream (ids repeat
	// across streams, and a shared key's holder may be another agent's run).
	// With the :todo twin the holder's entry may be the other stream's: not checked.
	if !c.Superseded && c.Holder.MessageID != "" && c.Holder.Agent == c.Agent && !m.cfg.twin {
		m.mu.Lock()
		h, ok := m.endedOn[c.Entry.Stream+"/"+c.Holder.MessageID]
		m.mu.Unlock()
		// Entered in a later millisecond than the run's end: after it (one clock).
		if entered := streamid.Time(c.Entry.ID); ok && h.owner == c.Entry.Consumer && entered.UnixMilli() > h.at.UnixMilli() {
			m.violate("NoStaleHolder", "worker %s: entry %s (entered %s) met the lease of entry %s, whose run ended on it at %s",
				c.Entry.Consumer, c.Entry.ID, entered.Format("15:04:05.000"), c.Holder.MessageID, h.at.Format("15:04:05.000"))
		}
	}
	outcome := "dropped"
	switch {
	case c.Cancelled:
		outcome = "cancelled"
	case c.Delivered:
		outcome = "delivered"
	case c.Queued:
		outcome = "coalesced"
	case c.Delayed:
		outcome = "delayed"
	case c.Waited:
		outcome = "waited"
	case c.Superseded:
		outcome = "superseded"
	}
	xonce.Queue(ctx, pipe, xonce.Append{Stream: m.results, ID: "rec-" + c.Entry.Stream + "/" + c.Entry.ID,
		Values: map[string]any{"id": c.Entry.Stream + "/" + c.Entry.ID, "outcome": outcome, "key": c.Agent + "/" + c.Issue}})
}

type mwEnv struct {
	t      *testing.T
	direct *redis.Client
	proxy  *redistest.LossyProxy
	client *redis.Client
	srv    *redistest.Server // a private server, for the restart step; nil on the shared one
	// replica of srv, for the lag and catchup steps; workers then wait for it
	// (lease.Options.WaitReplicas 1). Nil: no replica.
	replica *redistest.Server
	// plant, when set, wraps the batches' round trip of every worker that reads ahead
	// (the planted-defect tests).
	plant func(lockmw.BatchSend) lockmw.BatchSend
	// batches counts the batches sent by workers that read ahead (scripts, ends, the
	// ends sent two or more in one script, leases taken ahead), over all seeds.
	batches batchCount
}

// batchCount counts what the read-ahead seeds did; unrun: runs whose end a crash
// stopped, delivered again.
type batchCount struct{ scripts, ends, grouped, nexts, unrun atomic.Int64 }

func (b *batchCount) String() string {
	return fmt.Sprintf("%d batch scripts, %d ends (%d sent two or more in one script), %d leases taken ahead in them; "+
		"%d runs whose end a crash stopped", b.scripts.Load(), b.ends.Load(), b.grouped.Load(), b.nexts.Load(), b.unrun.Load())
}

func (e *mwEnv) run(cfg mwConfig, steps []mwStep) error {
	ns := redistest.Namespace()
	defer redistest.DeleteNamespace(context.Background(), e.direct, ns)
	format := lease.KeysCompat
	if cfg.cluster {
		format = lease.KeysCluster
	}
	m := &mwModel{t: e.t, nacked: map[*message.Message]bool{}, cfg: cfg, direct: e.direct, client: e.client, proxy: e.proxy, srv: e.srv, replica: e.replica, ns: ns, ctx: context.Background(),
		workers: map[string][]*mwWorker{}, results: "{" + ns + "results}", running: map[string]string{}, byID: map[string]*mwRun{},
		fences: map[string]int64{}, seen: map[string]bool{}, ran: map[string]int{}, tries: map[string]int{}, lidOf: map[string]string{},
		unruns: &e.batches.unrun, endedOn: map[string]mwEnded{}, mailRead: map[string]bool{}}
	m.newWorker = func(agent string, w, gen int) (*mwWorker, error) {
		o := e.client.Options()
		client := redis.NewClient(&redis.Options{Addr: o.Addr, DB: o.DB, MaxRetries: o.MaxRetries, Protocol: o.Protocol, DisableIdentity: true})
		owner := fmt.Sprintf("%s-w%d-g%d", agent, w, gen)
		lo := lease.Options{Scope: ns, TTL: 3 * time.Second, Format: format, Owner: owner}
		if e.replica != nil {
			lo.WaitReplicas, lo.WaitTimeout = 1, 100*time.Millisecond
		}
		l, err := lease.New(client, lo)
		if err != nil {
			return nil, err
		}
		// The consumer names the worker in its leases' records (the middleware's Owner):
		// a crash finds its leases by it.
		src := &mwSource{consumer: owner, settled: map[string]bool{}}
		policies := cfg.policies
		if w == 1 && cfg.otherConfl != "" {
			policies = cfg.others
		}
		wk := &mwWorker{client: client, owner: owner, gen: gen, src: src, handlers: map[string]message.HandlerFunc{}}
		// A middleware per subscription, as a worker has: its stream's, and its :todo
		// twin's (twin); one lease Locker for both.
		for _, stream := range m.streams(agent) {
			var source lockmw.Source = src
			if cfg.readahead {
				source = &mwReadAhead{mwSource: src, m: m, stream: stream}
			}
			mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: l, Agent: agent, Source: source, MaxIdleTime: time.Hour,
				Policies: policies, Scopes: cfg.scopes, OnConflict: m.record})
			if err != nil {
				return nil, err
			}
			if cfg.readahead {
				mw.SetBatchTiming(cfg.quick, cfg.flush)
				mw.WrapBatchSend(e.countBatches(m, owner))
			}
			wk.mws = append(wk.mws, mw)
			wk.handlers[stream] = mw.Handler(m.handler(agent))
		}
		wk.ctx, wk.cancel = context.WithCancel(context.Background())
		return wk, nil
	}
	for _, agent := range []string{"ag1", "ag2"} {
		for _, stream := range m.streams(agent) {
			if err := e.direct.XGroupCreateMkStream(m.ctx, stream, "g", "0").Err(); err != nil {
				return err
			}
		}
		for w := range 2 {
			wk, err := m.newWorker(agent, w, 0)
			if err != nil {
				return err
			}
			m.workers[agent] = append(m.workers[agent], wk)
		}
	}
	defer func() {
		for _, ws := range m.workers {
			for _, wk := range ws {
				// The router has stopped: ends that wait are sent, leases taken ahead given back.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				for _, mw := range wk.mws {
					mw.Close(ctx)
				}
				cancel()
				wk.cancel()
				_ = wk.client.Close()
			}
		}
	}()
	defer func() { // nothing may outlive the sequence
		for _, r := range m.runs {
			select {
			case r.ctl <- false:
			default:
			}
		}
	}()
	for i, s := range steps {
		if err := m.do(s); err != nil {
			return &mwStepError{at: i, err: err}
		}
	}
	return m.settle()
}

// countBatches wraps a worker's batch round trip: it counts the batches, traces them
// (MODEL_TRACE) and plants e.plant, if set.
func (e *mwEnv) countBatches(m *mwModel, owner string) func(lockmw.BatchSend) lockmw.BatchSend {
	return func(send lockmw.BatchSend) lockmw.BatchSend {
		if e.plant != nil {
			send = e.plant(send)
		}
		return func(ctx context.Context, ends []lease.End, nexts []lease.Next) ([]*lease.Pending, error) {
			if m.cfg.slowSend && len(nexts) == 0 {
				// A slow round trip for the batches that send ends alone (the timer's):
				// the driver's next steps meet them in flight.
				time.Sleep(3 * time.Millisecond)
			}
			e.batches.scripts.Add(1)
			e.batches.ends.Add(int64(len(ends)))
			e.batches.nexts.Add(int64(len(nexts)))
			if len(ends) > 1 {
				e.batches.grouped.Add(int64(len(ends)))
			}
			if os.Getenv("MODEL_TRACE") != "" {
				var ids []string
				for _, x := range ends {
					ids = append(ids, x.Entry.ID)
				}
				var ahead []string
				for _, x := range nexts {
					ahead = append(ahead, x.Options.MessageID)
				}
				m.t.Logf("%s: batch: ends %v, leases ahead %v", owner, ids, ahead)
			}
			return send(ctx, ends, nexts)
		}
	}
}

type mwStepError struct {
	at  int
	err error
}

func (e *mwStepError) Error() string { return e.err.Error() }

func (e *mwEnv) shrink(cfg mwConfig, steps []mwStep, first error) ([]mwStep, error) {
	var se *mwStepError
	if errors.As(first, &se) {
		steps = steps[:se.at+1]
	}
	last := first
	prop := func(err error) string { p, _, _ := strings.Cut(err.Error(), ":"); return p }
	deadline := time.Now().Add(15 * time.Second)
	for changed := true; changed && time.Now().Before(deadline); {
		changed = false
		for size := len(steps) / 2; size >= 1; size /= 2 {
			for i := len(steps) - size; i >= 0 && time.Now().Before(deadline); i -= size {
				try := append(append([]mwStep{}, steps[:i]...), steps[i+size:]...)
				if err := e.run(cfg, try); err != nil && prop(err) == prop(first) {
					steps, last, changed = try, err, true
				}
			}
		}
	}
	return steps, last
}

// newMWEnv is TestModelMiddleware's environment: the shared Redis, reached through a
// proxy that loses replies.
func newMWEnv(t *testing.T) *mwEnv {
	direct, _ := redistest.Client(t)
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	opts := *direct.Options()
	opts.Addr, opts.MaxRetries = proxy.Addr(), 3
	client := redis.NewClient(&opts)
	t.Cleanup(func() { _ = client.Close() })
	return &mwEnv{t: t, direct: direct, proxy: proxy, client: client}
}

// mwSeed is TestModelMiddleware's configuration and steps for seed.
func mwSeed(seed int) (mwConfig, []mwStep) {
	r := rand.New(rand.NewPCG(uint64(seed), 3434))
	cfg := genMWConfig(r)
	steps := genMWSteps(r, 40)
	genReadAhead(rand.New(rand.NewPCG(uint64(seed), 3737)), &cfg, steps)
	genMixedRules(rand.New(rand.NewPCG(uint64(seed), 3838)), &cfg)
	genTwin(rand.New(rand.NewPCG(uint64(seed), 4141)), &cfg)
	genTwinAhead(rand.New(rand.NewPCG(uint64(seed), 4343)), &cfg)
	return cfg, steps
}

// mwSequence is one configuration and its steps.
type mwSequence struct {
	cfg   mwConfig
	steps []mwStep
}

// directedMW are sequences that meet the batched hand-off whatever the machine's load
// (the random seeds meet it only when their timing lets an end wait for the entry that
// comes next): one worker runs events of one issue one after the other, each published
// after the run before it ended (tick), while that run's end waits for its batch (flush
// 1 s): the next entry takes its lease in the same batch as that release. In the
// second, the other worker of the agent takes every other one (and meets the lease of
// an end that waits on the first: busy, dropped). In the third, ends wait together.
func directedMW() []mwSequence {
	cfg := mwConfig{scope: "agent", onConfl: "*=drop", readahead: true, quick: time.Hour, flush: time.Second, issues: 1}
	cfg.policies, _ = lockmw.ParsePolicies(cfg.onConfl)
	cfg.scopes, _ = lease.ParseScopes(cfg.scope)
	n, x, other := mwStep{Kind: "new"}, mwStep{Kind: "next"}, mwStep{Kind: "next", B: 1}
	e := []mwStep{{Kind: "end"}, {Kind: "tick"}}
	seq := func(parts ...[]mwStep) []mwStep { return slices.Concat(parts...) }
	one := []mwStep{n, x}
	return []mwSequence{
		{cfg, seq(one, e, one, e, one, e, one, e)},
		{cfg, seq(one, e, []mwStep{n, other}, e, one, e, []mwStep{n, other}, e)},
		// Two runs of one worker on two issues end at once: their ends wait together.
		{cfg, []mwStep{n, {Kind: "new", B: 1}, {Kind: "deliver"}, {Kind: "deliver"}, {Kind: "burst"}}},
	}
}

// TestModelMiddleware runs seeded random sequences through lockmw's Handler, after the
// directed ones.
func TestModelMiddleware(t *testing.T) {
	e := newMWEnv(t)
	for i, d := range directedMW() {
		if err := e.run(d.cfg, d.steps); err != nil {
			t.Errorf("model checker: directed sequence %d (%s) fails: %v", i, d.cfg, err)
		}
	}
	from, n := redistest.ModelSeeds(t, 48)
	start := time.Now()
	e.checkSeeds(t, from, n, mwSeed)
	t.Logf("%d seeds of 40 steps in %s; read-ahead seeds sent %s", n, time.Since(start).Round(time.Millisecond), &e.batches)
}

// TestModelMiddlewareSupersede runs seeds whose configurations all supersede some
// events, with agents slow to stop, half of them with the agents' second workers on
// rules that do not supersede (genMixedRules): the random configurations of
// TestModelMiddleware are seldom such (MODEL_SEEDS=N, default 40).
func TestModelMiddlewareSupersede(t *testing.T) {
	e := newMWEnv(t)
	if err := e.run(givenBackTakeOverMW()); err != nil {
		t.Errorf("model checker: the given-back take-over (%v) fails: %v", givenBackTakeOverSteps, err)
	}
	from, n := redistest.ModelSeeds(t, 40) // seed 37 found the overlap that its directed sequence replays
	start := time.Now()
	e.checkSeeds(t, from, n, supersedeSeed)
	t.Logf("%d seeds of 40 steps in %s", n, time.Since(start).Round(time.Millisecond))
}

// givenBackTakeOverSteps: an event of P-1 runs on the second worker, whose rules do not
// supersede; a newer one, delivered to the first, takes it over and waits for it to
// stop (the agent is slow to); the first worker dies (its lease expires: the key is
// free, the old run still stops); a third event of P-1 reaches the second worker. It
// must wait for the old run, which its rules know nothing of.
var givenBackTakeOverSteps = []mwStep{{Kind: "new"}, {Kind: "new"}, {Kind: "deliver", B: 1}, {Kind: "deliver"},
	{Kind: "crash"}, {Kind: "new", A: 2}, {Kind: "deliver", A: 1, B: 1}, {Kind: "deliver", B: 1}}

func givenBackTakeOverMW() (mwConfig, []mwStep) {
	c := mwConfig{scope: "agent", onConfl: "a.x=supersede,*=drop", otherConfl: "*=drop", slowStop: true}
	c.policies, _ = lockmw.ParsePolicies(c.onConfl)
	c.others, _ = lockmw.ParsePolicies(c.otherConfl)
	c.scopes, _ = lease.ParseScopes(c.scope)
	return c, givenBackTakeOverSteps
}

// supersedeSeed is TestModelMiddlewareSupersede's configuration and steps for seed:
// standalone or Cluster keys, scope agent, type a.x superseding, the others' rules
// drawn, the agent slow to stop.
func supersedeSeed(seed int) (mwConfig, []mwStep) {
	r := rand.New(rand.NewPCG(uint64(seed), 3939))
	pols := []string{"drop", "coalesce", "deliver", "supersede", "delay:10s"}
	c := mwConfig{cluster: r.IntN(2) == 1, scope: "agent",
		onConfl: "a.x=supersede,b.x=" + pols[r.IntN(len(pols))] + ",*=" + pols[r.IntN(len(pols))]}
	c.parse()
	steps := genMWSteps(r, 40)
	for i := range steps {
		// A worker's death while its take-over waits is what leaves a free key beside a
		// run still stopping: more crashes, fewer ends.
		if steps[i].Kind == "end" && r.IntN(2) == 0 {
			steps[i].Kind = "crash"
		}
	}
	genMixedRules(r, &c)
	c.slowStop = true
	return c, steps
}

// TestModelMiddlewareSharedWait runs seeds whose configurations wait in the shared
// key's line (scope issue or a group key, standalone or Cluster keys), beside drop and
// delay for some types: two agents' events of one issue (or of one group) meet in one
// line, whose holder may be another agent's run (MODEL_SEEDS=N, default 24).
func TestModelMiddlewareSharedWait(t *testing.T) { checkSeedsOf(t, 24, sharedWaitSeed) }

// TestModelMiddlewareDeliver draws the deliver policy for most events (the random
// configurations draw it for few): follow-ups meet busy leases, are delivered to their
// mailboxes, read by the runs (DeliveredReachesARun) and woken for after the holder's
// release; with the :todo twin (genTwin), follow-ups of two streams whose ids repeat.
// MODEL_SEEDS=N runs N seeds (default 48).
func TestModelMiddlewareDeliver(t *testing.T) { checkSeedsOf(t, 48, deliverSeed) }

// checkSeedsOf runs the seeds MODEL_SEED and MODEL_SEEDS name (def of them by default),
// each's configuration and steps from gen.
func checkSeedsOf(t *testing.T, def int, gen func(int) (mwConfig, []mwStep)) {
	e := newMWEnv(t)
	from, n := redistest.ModelSeeds(t, def)
	start := time.Now()
	e.checkSeeds(t, from, n, gen)
	t.Logf("%d seeds of 40 steps in %s", n, time.Since(start).Round(time.Millisecond))
}

// deliverSeed is TestModelMiddlewareDeliver's configuration and steps for seed: scope
// agent (a shared scope refuses deliver), a.x delivers, the other types draw any policy
// the middleware accepts beside it.
func deliverSeed(seed int) (mwConfig, []mwStep) {
	r := rand.New(rand.NewPCG(uint64(seed), 4242))
	pols := []string{"deliver", "deliver", "drop", "coalesce", "supersede", "delay:10s"}
	c := mwConfig{cluster: r.IntN(2) == 1, scope: "agent"}
	parts := []string{"a.x=deliver"}
	for _, t := range mwTypes[1:][:r.IntN(3)] {
		parts = append(parts, t+"="+pols[r.IntN(len(pols))])
	}
	c.onConfl = strings.Join(append(parts, "*="+pols[r.IntN(len(pols))]), ",")
	c.parse()
	steps := genMWSteps(r, 40)
	genTwin(r, &c)
	return c, steps
}

// sharedWaitSeed is TestModelMiddlewareSharedWait's configuration and steps for seed.
func sharedWaitSeed(seed int) (mwConfig, []mwStep) {
	r := rand.New(rand.NewPCG(uint64(seed), 4040))
	pols := []string{"drop", "delay:10s", "wait", "wait:2"}
	c := mwConfig{cluster: r.IntN(2) == 1, scope: []string{"issue", "group:m:grp"}[r.IntN(2)]}
	parts := []string{"a.x=" + []string{"wait", "wait:2"}[r.IntN(2)]}
	for _, t := range mwTypes[1:][:r.IntN(3)] {
		parts = append(parts, t+"="+pols[r.IntN(len(pols))])
	}
	c.onConfl = strings.Join(append(parts, "*="+pols[r.IntN(len(pols))]), ",")
	c.parse()
	steps := genMWSteps(r, 40)
	for i := range steps {
		if r.IntN(12) == 0 {
			steps[i].Kind = "sweep" // a tick of the line waker
		}
	}
	genTwin(r, &c)
	return c, steps
}

// checkSeeds runs seeds [from, from+n), each's configuration and steps from gen, and
// reports each property's first violation with its seed and shortest sequence.
func (e *mwEnv) checkSeeds(t *testing.T, from, n int, gen func(int) (mwConfig, []mwStep)) {
	failed := map[string]bool{}
	for seed := from; seed < from+n; seed++ {
		cfg, steps := gen(seed)
		t0 := time.Now()
		err := e.run(cfg, steps)
		if testing.Verbose() {
			t.Logf("seed %d (%s) in %s: %v", seed, cfg, time.Since(t0).Round(time.Millisecond), err)
		}
		if err == nil {
			continue
		}
		p, _, _ := strings.Cut(err.Error(), ":")
		if failed[p] {
			t.Logf("seed %d (%s) fails too: %v", seed, cfg, err)
			continue
		}
		failed[p] = true
		short, serr := e.shrink(cfg, steps, err)
		t.Errorf("model checker: seed %d (%s) fails\n  %v\n  shortest sequence (%d of %d steps): %v\n  its failure: %v",
			seed, cfg, err, len(short), len(steps), short, serr)
	}
}

// checkLines checks the wait policy's lines once settled (recs: the conflict records):
// every event that waited ran exactly once, as one of its copies (WaitedRunsOnce:
// nothing lost, nothing twice), and no line is left with events in it
// (NothingStranded). The order of a line is the lease model's (TestModelLeaseLine,
// LineOrder).
func (m *mwModel) checkLines(recs []redis.XMessage) error {
	runsOf := map[string]int{}
	for _, id := range m.ranOrder {
		runsOf[m.lidOf[id]]++
	}
	seenLid := map[string]bool{}
	for _, r := range recs {
		if fmt.Sprint(r.Values["outcome"]) != "waited" {
			continue
		}
		id := fmt.Sprint(r.Values["id"])
		lid := m.lidOf[id]
		if seenLid[lid] {
			continue
		}
		seenLid[lid] = true
		if runsOf[lid] != 1 {
			return fmt.Errorf("property WaitedRunsOnce: event %s waited in line and ran %d times", lid, runsOf[lid])
		}
	}
	lines, err := m.direct.Keys(m.ctx, "lockline:*"+m.ns+"*").Result()
	if err != nil {
		return err
	}
	if len(lines) > 0 {
		return fmt.Errorf("property NothingStranded: events left waiting in lines: %v", lines)
	}
	return nil
}

// TestModelMiddlewareRedisRestart runs sequences on a private Redis with AOF
// (appendfsync always) that is killed and restarted in the middle of each, between
// whatever calls the workers are making: runs under way, leases held, acquires and
// releases in flight. The same properties hold after it (MODEL_SEEDS=N, default 4).
func TestModelMiddlewareRedisRestart(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	direct := srv.Client()
	proxy := redistest.NewLossyProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: 3, DisableIdentity: true})
	t.Cleanup(func() { _ = client.Close() })
	e := &mwEnv{t: t, direct: direct, proxy: proxy, client: client, srv: srv}
	from, n := redistest.ModelSeeds(t, 4)
	start := time.Now()
	for seed := from; seed < from+n; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 3535))
		cfg := genMWConfig(r)
		steps := genMWSteps(r, 30)
		steps = append(append(steps[:15:15], mwStep{Kind: "restart"}), steps[15:]...)
		if err := e.run(cfg, steps); err != nil {
			t.Errorf("model checker with a Redis restart: seed %d (%s) fails\n  %v\n  sequence: %v", seed, cfg, err, steps)
		}
	}
	t.Logf("%d seeds of 31 steps, one a Redis restart, in %s", n, time.Since(start).Round(time.Millisecond))
}

// TestModelMiddlewareLaggingReplica runs sequences on a private primary whose one
// replica the workers wait for (lease.Options.WaitReplicas 1), with steps that pause
// the replica (lag: it acknowledges nothing) and resume it (catchup) between the
// others: acquires refused and given back, leases not taken while it lags, extends that
// do not count. The same properties hold (MODEL_SEEDS=N, default 8).
func TestModelMiddlewareLaggingReplica(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{Args: []string{"--repl-diskless-sync-delay", "0"}})
	replica := redistest.StartServer(t, redistest.ServerOptions{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(srv.Port())}})
	direct := srv.Client()
	redistest.Eventually(t, 10*time.Second, func() bool {
		pipe := direct.Pipeline()
		pipe.Set(context.Background(), "replica-ready", "1", time.Minute)
		wait := pipe.Do(context.Background(), "wait", 1, 100)
		_, err := pipe.Exec(context.Background())
		return err == nil && wait.Val() == int64(1)
	}, "the replica to come online")
	proxy := redistest.NewLossyProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: 3, DisableIdentity: true})
	t.Cleanup(func() { _ = client.Close() })
	e := &mwEnv{t: t, direct: direct, proxy: proxy, client: client, srv: srv, replica: replica}
	t.Cleanup(replica.Resume)
	from, n := redistest.ModelSeeds(t, 8)
	start := time.Now()
	check := func(seed int) {
		r := rand.New(rand.NewPCG(uint64(seed), 3636))
		cfg := genMWConfig(r)
		steps := genMWSteps(r, 30)
		for i := range steps {
			if r.IntN(6) == 0 {
				steps[i].Kind = []string{"lag", "catchup"}[r.IntN(2)]
			}
		}
		if err := e.run(cfg, steps); err != nil {
			t.Errorf("model checker with a lagging replica: seed %d (%s) fails\n  %v\n  sequence: %v", seed, cfg, err, steps)
		}
	}
	for seed := from; seed < from+n; seed++ {
		check(seed)
	}
	for _, seed := range laggingRegressionSeeds {
		check(seed)
	}
	t.Logf("%d seeds of 30 steps with a lagging replica, and %d regression seeds, in %s", n, len(laggingRegressionSeeds), time.Since(start).Round(time.Millisecond))
}

// laggingRegressionSeeds are TestModelMiddlewareLaggingReplica's seeds beyond its range
// that once failed, run every time. 20880032 (make explore; wait policy) left an entry
// without a record in some runs: its event's joining of the line lost its reply past
// go-redis's retries (several lost replies armed at once), the script had acked the
// entry, and nobody recorded it; in others its entry came back while the line reserved
// the key for it, and the middleware took the reserved key (which names the event's
// first entry) for its in-flight holder: settled, neither recorded nor acked. The wait
// script now leaves the ack to its caller, after the record, and a copy the lease
// refused as one is never the holder's own.
var laggingRegressionSeeds = []int{20880032}
