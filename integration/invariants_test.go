package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/runners"
)

// streamEntry is one published event: an entry of an input stream.
type streamEntry struct {
	route                   event.Route
	stream, id              string
	issue, eventType, fence string
	at                      time.Time
	values                  map[string]any
}

func (e streamEntry) key() string { return e.stream + " " + e.id }

// state is what Redis holds at one moment: every input entry, the results and dead
// streams indexed by the entry they are about, and the pending count of every group.
type state struct {
	entries   []streamEntry
	results   []redis.XMessage
	dead      []redis.XMessage
	resultsOf map[string][]redis.XMessage // entry key → its terminal records, in order
	deadOf    map[string][]redis.XMessage // entry key → its dead letters
	pending   map[string]int64            // "stream group" → XPENDING count
	// The busy policies' bookkeeping (see policyaccount_test.go): entries appended
	// again by the delay policy, by the entry they were delayed from; follow-up records
	// (deliver) by the follow-up's agent and entry id; members left in delayed sets.
	promoted    map[string][]streamEntry
	followupsOf map[string][]redis.XMessage
	delayedLeft map[string]int64
}

// terminalTypes are the results records that end an event. An event delayed (its
// copy appended again later) or delivered to a holder's mailbox ends with that record;
// what became of the copy or the follow-up is checked on its own (checkPolicies).
var terminalTypes = []string{event.StageDone, event.StageFailed, event.LockDropped,
	event.LockCoalesced, event.LockDelayed, event.LockDelivered, event.LockSuperseded}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func (s *scenario) snapshot(ctx context.Context) (*state, error) {
	return snapshotOf(ctx, s.rdb)
}

func snapshotOf(ctx context.Context, rdb redis.Cmdable) (*state, error) {
	st := &state{resultsOf: map[string][]redis.XMessage{}, deadOf: map[string][]redis.XMessage{}, pending: map[string]int64{}}
	for _, r := range topo.AllInputs() {
		msgs, err := rdb.XRange(ctx, r.Stream, "-", "+").Result()
		if err != nil {
			return nil, fmt.Errorf("XRANGE %s: %w", r.Stream, err)
		}
		for _, m := range msgs {
			st.entries = append(st.entries, streamEntry{route: r, stream: r.Stream, id: m.ID,
				issue: str(m.Values["m:"+event.MetaIssueKey]), eventType: str(m.Values["m:"+event.MetaEventType]),
				fence: str(m.Values["m:"+event.MetaFence]), at: streamid.Time(m.ID), values: m.Values})
		}
		p, err := rdb.XPending(ctx, r.Stream, r.Group).Result()
		switch {
		case err != nil && strings.HasPrefix(err.Error(), "NOGROUP"):
		case err != nil:
			return nil, fmt.Errorf("XPENDING %s %s: %w", r.Stream, r.Group, err)
		default:
			st.pending[r.Stream+" "+r.Group] = p.Count
		}
	}
	if err := st.readPolicies(ctx, rdb); err != nil {
		return nil, err
	}
	var err error
	if st.results, err = rdb.XRange(ctx, topo.Results(), "-", "+").Result(); err != nil {
		return nil, fmt.Errorf("XRANGE %s: %w", topo.Results(), err)
	}
	for _, m := range st.results {
		if slices.Contains(terminalTypes, str(m.Values["event_type"])) {
			k := str(m.Values["stream"]) + " " + str(m.Values["message_id"])
			st.resultsOf[k] = append(st.resultsOf[k], m)
		}
		st.indexFollowup(m)
	}
	if st.dead, err = rdb.XRange(ctx, topo.Dead(), "-", "+").Result(); err != nil {
		return nil, fmt.Errorf("XRANGE %s: %w", topo.Dead(), err)
	}
	for _, m := range st.dead {
		k := str(m.Values[event.DeadFieldStream]) + " " + str(m.Values[event.DeadFieldID])
		st.deadOf[k] = append(st.deadOf[k], m)
	}
	return st, nil
}

// ---- the ledger ----

// run is one runner process, from the ledger.
type run struct {
	agent, branch, issue string
	fence                int64
	attempt              int
	workerPID, pid       int
	msgID                string
	start, end           time.Time
	how                  string // ok, term (SIGTERM from its worker), killed (worker SIGKILLed), exited, open
}

func (r run) String() string {
	return fmt.Sprintf("%s %s fence %d attempt %d msg %s worker %d runner %d [%s, %s] %s", r.agent, r.issue,
		r.fence, r.attempt, r.msgID, r.workerPID, r.pid, r.start.Format("15:04:05.000"), r.end.Format("15:04:05.000"), r.how)
}

// readLedger parses the ledger file. Runs without an end line end at their worker's
// SIGKILL (kills), or at its exit (exits); else they are open.
func readLedger(path string, kills, exits map[int]time.Time) ([]run, []string, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	byPID := map[int]*run{}
	var order []int
	var bad []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || (fs[0] != "start" && fs[0] != "end") {
			bad = append(bad, "malformed ledger line: "+sc.Text())
			continue
		}
		fence, _ := strconv.ParseInt(fs[4], 10, 64)
		attempt, _ := strconv.Atoi(fs[5])
		wpid, _ := strconv.Atoi(fs[6])
		pid, _ := strconv.Atoi(fs[7])
		ns, err := strconv.ParseInt(fs[9], 10, 64)
		if err != nil {
			bad = append(bad, "malformed ledger time: "+sc.Text())
			continue
		}
		at := time.Unix(0, ns)
		if fs[0] == "start" {
			byPID[pid] = &run{agent: fs[1], branch: fs[2], issue: fs[3], fence: fence, attempt: attempt,
				workerPID: wpid, pid: pid, msgID: fs[8], start: at, how: "open"}
			order = append(order, pid)
			continue
		}
		r, ok := byPID[pid]
		if !ok {
			bad = append(bad, "ledger end without a start: "+sc.Text())
			continue
		}
		r.end = at
		r.how = "ok"
		if len(fs) > 10 {
			r.how = fs[10]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	runs := make([]run, 0, len(order))
	for _, pid := range order {
		r := byPID[pid]
		if r.how == "open" {
			if at, ok := kills[r.workerPID]; ok && at.After(r.start) {
				r.end, r.how = at, "killed"
			} else if at, ok := exits[r.workerPID]; ok && at.After(r.start) {
				r.end, r.how = at, "exited"
			}
		}
		runs = append(runs, *r)
	}
	return runs, bad, nil
}

func (s *scenario) runs() ([]run, []string) {
	s.t.Helper()
	s.mu.Lock()
	kills := map[int]time.Time{}
	for k, v := range s.kills {
		kills[k] = v
	}
	exits := map[int]time.Time{}
	for _, w := range s.all {
		if at, _, gone := w.exited(); gone {
			exits[w.pid] = at
		}
	}
	s.mu.Unlock()
	runs, bad, err := readLedger(s.ledger, kills, exits)
	if err != nil {
		s.t.Fatalf("ledger: %v", err)
	}
	return runs, bad
}

// ---- invariants ----

// report sums up one check of the invariants.
type report struct {
	events                      int // published events (input stream entries)
	done, failed, dead, dropped int
	runs                        int
	delayed, delivered          int // events re-queued (delay) or put in a holder's mailbox (deliver)
	superseded                  int // events replaced by a newer one (supersede)
	policy                      policyReport
	crashDuplicates             []string // tolerated: see checkOptions
	// resolutionLost: issues whose only triage record is "skipped" (a redelivery found the
	// labels of a run that wrote them but could not record its outcome): consistent with
	// the labels, but the resolution is missing from ymir:results.
	resolutionLost []string
	violations     []string
}

func (r report) String() string {
	return fmt.Sprintf("%d events: %d done, %d failed (stage.failed + dead letter), %d dead only, %d dropped as locked, "+
		"%d delayed, %d delivered to a mailbox%s, %d superseded; "+
		"%d runner runs; %d duplicate outcomes after a crash; %d triage outcomes recorded only as skipped; %d violations",
		r.events, r.done, r.failed, r.dead, r.dropped, r.delayed, r.delivered, r.policy, r.superseded, r.runs, len(r.crashDuplicates),
		len(r.resolutionLost), len(r.violations))
}

type checkOptions struct {
	// crashDuplicates tolerates a second outcome record for an event when a worker of its
	// group was SIGKILLed between the two: the kill landed after the handler recorded the
	// outcome and before its release+ack, so the event is redelivered (at least once).
	crashDuplicates bool
	// jira checks the final labels of every issue (off for the in-process cluster suite,
	// which has its own Jira).
	labels func(key string) []string
	// noLabels skips check 5 (scenarios that publish downstream requests by hand, with
	// no triage outcome to check the labels against).
	noLabels bool
	// exclusive returns the keys, besides its agent and issue, that no two runs may
	// hold at once: the shared lease keys of LOCK_SCOPE issue and group (nil: none).
	exclusive func(r run) []string
	// minDelay is the shortest delay of the delay policy: a delayed copy never runs
	// before its record's delayed_until, which is never less than minDelay after it.
	minDelay time.Duration
}

// checkInvariants checks, once everything has settled:
//  1. every published event has exactly one terminal outcome: stage.done, stage.failed with
//     its dead letter, a dead letter alone (bad events), or lock.dropped naming the holder;
//  2. no two runs of one (agent, issue) overlap in the ledger;
//  3. fences strictly increase per (agent, issue) across leases (attempts within one lease
//     share their fence);
//  4. XPENDING is empty for every group;
//  5. every issue's Jira labels match its last terminal record, and no _in_progress label
//     is left.
func (s *scenario) checkInvariants(o checkOptions) report {
	s.t.Helper()
	if o.labels == nil && !o.noLabels {
		o.labels = s.fj.Labels
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := s.snapshot(ctx)
	if err != nil {
		s.t.Fatalf("snapshot: %v", err)
	}
	runs, bad := s.runs()
	s.mu.Lock()
	issues := slices.Clone(s.issues)
	killTimes := make([]time.Time, 0, len(s.kills))
	for _, at := range s.kills {
		killTimes = append(killTimes, at)
	}
	s.mu.Unlock()
	rep := checkState(st, runs, issues, killTimes, o)
	rep.violations = append(bad, rep.violations...)
	s.t.Logf("invariants: %s", rep)
	for _, d := range rep.crashDuplicates {
		s.t.Logf("tolerated duplicate outcome after a SIGKILL: %s", d)
	}
	for _, d := range rep.policy.followDuplicates {
		s.t.Logf("tolerated second record of a follow-up after a SIGKILL: %s", d)
	}
	for _, d := range rep.resolutionLost {
		s.t.Logf("triage outcome recorded only as skipped (resolution missing from ymir:results): %s", d)
	}
	if len(rep.violations) > 0 {
		shown := rep.violations
		if len(shown) > 40 {
			shown = append(slices.Clone(shown[:40]), fmt.Sprintf("… and %d more", len(rep.violations)-40))
		}
		s.t.Errorf("%d invariant violations:\n%s", len(rep.violations), strings.Join(shown, "\n"))
	}
	return rep
}

func checkState(st *state, runs []run, issues []string, kills []time.Time, o checkOptions) report {
	c := &checker{st: st, runs: runs, kills: kills, o: o}
	c.rep.events = len(st.entries)
	c.rep.runs = len(runs)

	// 1. One terminal outcome per published event.
	known := c.checkOutcomes()
	checkPolicies(st, runs, kills, o, &c.rep, c.v)
	c.checkStrays(known)
	// 2, 3. The ledger: no overlap, fences increase.
	c.checkLedger()
	// 4. XPENDING empty.
	for g, n := range st.pending {
		if n != 0 {
			c.v("XPENDING %s: %d entries left", g, n)
		}
	}
	// 5. Jira labels match the last terminal records.
	if o.labels != nil {
		c.checkLabels(issues)
	}
	return c.rep
}

// checker holds what checkState checks and the report it writes.
type checker struct {
	st    *state
	runs  []run
	kills []time.Time
	o     checkOptions
	rep   report
}

// v records a violation.
func (c *checker) v(format string, args ...any) {
	c.rep.violations = append(c.rep.violations, fmt.Sprintf(format, args...))
}

// killedBetween reports whether a worker was SIGKILLed between a and b (1 ms slack).
func (c *checker) killedBetween(a, b time.Time) bool {
	for _, k := range c.kills {
		if !k.Before(a.Add(-time.Millisecond)) && !k.After(b.Add(time.Millisecond)) {
			return true
		}
	}
	return false
}

// checkOutcomes checks invariant 1 (one terminal outcome per published event) and
// counts the outcomes; it returns the keys of every published entry.
func (c *checker) checkOutcomes() map[string]bool {
	known := map[string]bool{}
	for _, e := range c.st.entries {
		k := e.key()
		known[k] = true
		rs, ds := c.st.resultsOf[k], c.st.deadOf[k]
		what := fmt.Sprintf("%s %s (%s %s)", e.stream, e.id, e.eventType, e.issue)
		if len(rs) > 1 {
			if !c.toleratedDuplicates(e, rs) {
				c.v("%s has %d terminal records: %s", what, len(rs), describe(rs))
				continue
			}
			c.rep.crashDuplicates = append(c.rep.crashDuplicates, fmt.Sprintf("%s: %s", what, describe(rs)))
			rs = rs[len(rs)-1:]
		}
		switch {
		case len(rs) == 0 && len(ds) == 1:
			c.rep.dead++
		case len(rs) == 0 && len(ds) == 0:
			c.v("%s has no terminal record", what)
		case len(ds) > 1:
			c.v("%s is dead-lettered %d times", what, len(ds))
		default:
			c.checkTerminal(e, rs, ds, what)
		}
	}
	return known
}

// toleratedDuplicates reports whether entry e's several terminal records rs are each
// explained by a SIGKILL between two of them (allowed by checkOptions.crashDuplicates).
func (c *checker) toleratedDuplicates(e streamEntry, rs []redis.XMessage) bool {
	ok := c.o.crashDuplicates
	for i := 1; ok && i < len(rs); i++ {
		prev, cur := rs[i-1], rs[i]
		pf, _ := strconv.ParseInt(str(prev.Values["fence"]), 10, 64)
		cf, _ := strconv.ParseInt(str(cur.Values["fence"]), 10, 64)
		pt, ct := streamid.Time(prev.ID), streamid.Time(cur.ID)
		et, pet := str(cur.Values["event_type"]), str(prev.Values["event_type"])
		ran := et == event.StageDone || et == event.StageFailed
		// A redelivery after the kill may also meet another run of the issue
		// (a shared scope's key held by another agent, a coalesced or delayed
		// event's own run) and be handled by its busy policy instead.
		met := !ran && slices.Contains(terminalTypes, et) && (pet == event.StageDone || pet == event.StageFailed) &&
			!metOwnRun(cur, e)
		if (ran && cf <= pf) || (!ran && !met) || !c.killedBetween(pt, ct) {
			ok = false
		}
	}
	return ok
}

// checkTerminal checks entry e's one terminal record rs[0] against its dead letters ds
// and counts it by type.
func (c *checker) checkTerminal(e streamEntry, rs, ds []redis.XMessage, what string) {
	r := rs[0]
	switch et := str(r.Values["event_type"]); et {
	case event.StageDone:
		c.rep.done++
		if len(ds) > 0 {
			c.v("%s is done and dead-lettered", what)
		}
	case event.StageFailed:
		c.rep.failed++
		if len(ds) != 1 {
			c.v("%s failed without its dead letter", what)
		}
	case event.LockDropped, event.LockCoalesced:
		c.rep.dropped++
		if metOwnRun(r, e) {
			c.v("%s met its own earlier run as the holder: %s", what, describe(rs))
		}
		if str(r.Values["holder"]) == "" && str(r.Values["holder_message_id"]) == "" {
			c.v("%s dropped without naming the holder: %s", what, describe(rs))
		}
		if len(ds) > 0 {
			c.v("%s is dropped and dead-lettered", what)
		}
	case event.LockSuperseded:
		// Only a newer event of the stream supersedes (stream ids compare).
		c.rep.superseded++
		if by := str(r.Values["holder_message_id"]); by == "" || streamid.Compare(by, e.id) <= 0 {
			c.v("%s superseded by %q, not a newer entry: %s", what, by, describe(rs))
		}
		if len(ds) > 0 {
			c.v("%s is superseded and dead-lettered", what)
		}
	case event.LockDelayed, event.LockDelivered:
		if metOwnRun(r, e) {
			c.v("%s met its own earlier run as the holder: %s", what, describe(rs))
		}
		if et == event.LockDelayed {
			c.rep.delayed++
		} else {
			c.rep.delivered++
		}
		if len(ds) > 0 {
			c.v("%s is %s and dead-lettered", what, et)
		}
	}
}

// checkStrays: every terminal record and dead letter belongs to a published entry.
func (c *checker) checkStrays(known map[string]bool) {
	for k, rs := range c.st.resultsOf {
		if !known[k] {
			c.v("terminal record for an entry that is in no input stream: %s", describe(rs))
		}
	}
	for k := range c.st.deadOf {
		if !known[k] {
			c.v("dead letter for an entry that is in no input stream: %s", k)
		}
	}
}

// checkLedger checks invariants 2 and 3 on the runner's ledger: every run ended, runs of
// one key (or holding one shared key) never overlap, and fences increase.
func (c *checker) checkLedger() {
	byKey, byShared := map[string][]run{}, map[string][]run{}
	for _, r := range c.runs {
		if r.how == "open" {
			c.v("run never ended: %s", r)
			continue
		}
		k := r.agent + " " + r.issue
		byKey[k] = append(byKey[k], r)
		if c.o.exclusive != nil {
			for _, x := range c.o.exclusive(r) {
				byShared[x] = append(byShared[x], r)
			}
		}
	}
	// Runs holding one shared key (LOCK_SCOPE issue or group): never at once, whatever
	// their agent or issue.
	for x, rs := range byShared {
		slices.SortFunc(rs, func(a, b run) int { return a.start.Compare(b.start) })
		for i := 1; i < len(rs); i++ {
			if prev, cur := rs[i-1], rs[i]; cur.start.Before(prev.end) {
				c.v("overlapping runs holding %s (by %s):\n  %s\n  %s", x, prev.end.Sub(cur.start), prev, cur)
			}
		}
	}
	for _, rs := range byKey {
		slices.SortFunc(rs, func(a, b run) int { return a.start.Compare(b.start) })
		for i := 1; i < len(rs); i++ {
			prev, cur := rs[i-1], rs[i]
			if cur.start.Before(prev.end) {
				c.v("overlapping runs (by %s):\n  %s\n  %s", prev.end.Sub(cur.start), prev, cur)
			}
			sameLease := cur.fence == prev.fence && cur.workerPID == prev.workerPID && cur.msgID == prev.msgID &&
				cur.attempt > prev.attempt
			if cur.fence <= prev.fence && !sameLease {
				c.v("fence does not increase:\n  %s\n  %s", prev, cur)
			}
		}
	}
}

// lastRecords returns, per issue, the last done/failed record of each agent and the
// last skipped triage record.
func (c *checker) lastRecords() (last map[string]map[string]redis.XMessage, skipped map[string]redis.XMessage) {
	last = map[string]map[string]redis.XMessage{} // issue → agent → last done/failed record
	skipped = map[string]redis.XMessage{}         // issue → last skipped triage record
	for _, m := range c.st.results {
		et := str(m.Values["event_type"])
		if et != event.StageDone && et != event.StageFailed {
			continue
		}
		if str(m.Values["outcome"]) == "skipped" {
			skipped[str(m.Values["issue_key"])] = m
			continue
		}
		is := str(m.Values["issue_key"])
		if last[is] == nil {
			last[is] = map[string]redis.XMessage{}
		}
		last[is][str(m.Values["agent"])] = m
	}
	return last, skipped
}

// checkLabels checks invariant 5: each issue's Jira labels match its last terminal records.
func (c *checker) checkLabels(issues []string) {
	last, skipped := c.lastRecords()
	for _, is := range issues {
		have := c.o.labels(is)
		for _, l := range have {
			if strings.HasSuffix(l, "_in_progress") {
				c.v("%s: stuck label %s (labels %v)", is, l, have)
			}
		}
		tr, ok := last[is]["triage"]
		if !ok {
			if tr, ok = c.triageStandIn(is, have, last[is], skipped); !ok {
				continue
			}
		}
		want, notWant := expectedLabels(tr, last[is])
		if want == "" {
			c.v("%s: no outcome to check the labels against: triage %s", is, describe([]redis.XMessage{tr}))
			continue
		}
		if !slices.Contains(have, want) {
			c.v("%s: labels %v lack %s (last records: %s)", is, have, want, describeAll(last[is]))
		}
		if notWant != "" && slices.Contains(have, notWant) {
			c.v("%s: labels %v still have %s (last records: %s)", is, have, notWant, describeAll(last[is]))
		}
	}
}

// triageStandIn is the record that decides issue is's labels when it has no triage
// done/failed record: its triage event ended as "skipped" (a redelivery found the
// resolution label of a run that had published but not recorded: crash, lease lost), so
// the newest downstream outcome stands in. ok is false when there is none (the issue is
// reported, or tolerated as a lost resolution).
func (c *checker) triageStandIn(is string, have []string, last map[string]redis.XMessage, skipped map[string]redis.XMessage) (tr redis.XMessage, ok bool) {
	for _, a := range event.Agents[1:] {
		if dr, ok := last[a]; ok && (tr.Values == nil || streamid.Compare(dr.ID, tr.ID) > 0) {
			tr = redis.XMessage{ID: dr.ID, Values: map[string]any{"event_type": event.StageDone, "outcome": a}}
		}
	}
	if tr.Values != nil {
		return tr, true
	}
	sk, found := skipped[is]
	if found && slices.ContainsFunc(have, labels.IsTerminal) &&
		strings.Contains(str(sk.Values["detail"]), "already handled") {
		c.rep.resolutionLost = append(c.rep.resolutionLost, fmt.Sprintf("%s: labels %v, records %s", is, have,
			describe(recordsOf(c.st, is))))
		return tr, false
	}
	c.v("%s: no triage outcome (labels %v); its records: %s", is, have, describe(recordsOf(c.st, is)))
	return tr, false
}

// expectedLabels returns the label an issue must carry given its last triage record and
// the last record of each downstream agent, and one it must not carry ("" for none).
func expectedLabels(tr redis.XMessage, last map[string]redis.XMessage) (want, notWant string) {
	if str(tr.Values["event_type"]) == event.StageFailed {
		return labels.TriageErrored, ""
	}
	res := str(tr.Values["outcome"])
	if !runners.IsDispatched(res) {
		return handlers.ResolutionLabel(res), ""
	}
	dr, ok := last[res]
	if !ok {
		return handlers.ResolutionLabel(res) + " then a " + res + " outcome (none recorded)", ""
	}
	if str(dr.Values["event_type"]) == event.StageFailed {
		return labels.ErroredFor(res), labels.TriagedFor(res)
	}
	return labels.DoneFor(res), labels.TriagedFor(res)
}

// metOwnRun reports whether conflict record r of entry e names e's own run as the
// holder (the ids of two streams may be equal: a shared key's holder is of another
// agent's stream).
func metOwnRun(r redis.XMessage, e streamEntry) bool {
	ha := str(r.Values["holder_agent"])
	return str(r.Values["holder_message_id"]) == e.id && (ha == "" || ha == e.route.Agent)
}

func describe(rs []redis.XMessage) string {
	var parts []string
	for _, r := range rs {
		p := fmt.Sprintf("[%s %s agent=%s fence=%s outcome=%s", r.ID, str(r.Values["event_type"]), str(r.Values["agent"]),
			str(r.Values["fence"]), str(r.Values["outcome"]))
		if h := str(r.Values["holder"]); h != "" || str(r.Values["reason"]) != "" {
			p += fmt.Sprintf(" holder=%s holder_fence=%v reason=%s", h, r.Values["holder_fence"], str(r.Values["reason"]))
		}
		parts = append(parts, p+"]")
	}
	return strings.Join(parts, " ")
}

func describeAll(m map[string]redis.XMessage) string {
	var rs []redis.XMessage
	for _, r := range m {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b redis.XMessage) int { return strings.Compare(a.ID, b.ID) })
	return describe(rs)
}

// recordsOf returns every results record of an issue, in order.
func recordsOf(st *state, issue string) []redis.XMessage {
	var out []redis.XMessage
	for _, m := range st.results {
		if str(m.Values["issue_key"]) == issue {
			out = append(out, m)
		}
	}
	return out
}
