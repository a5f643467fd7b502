package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// The lease scopes (LOCK_SCOPE) and the busy policies (ON_CONFLICT) of issue 23 and the
// deliver policy of issue 24, with real worker processes SIGKILLed at random.

// seedJira puts issues into the fake Jira without publishing anything for them (the
// scenarios below publish their own requests).
func (s *scenario) seedJira(keys ...string) {
	now := time.Now()
	var seed []fakejira.Issue
	for _, k := range keys {
		seed = append(seed, fakejira.Issue{Key: k, Summary: "integration issue " + k, Status: "New", Updated: now, Created: now})
	}
	s.fj.AddIssues(seed...)
}

// publish appends one request for key to g's input stream, as `ymirflow enqueue` makes
// it, with more metadata of the Task (meta), and returns its stream id. It may be called
// from any goroutine.
func (s *scenario) publish(g group, key string, meta map[string]any) (string, error) {
	var task event.Task
	set := map[string]any{"issue": key}
	if g.agent != "triage" {
		set = map[string]any{"jira_issue": key, "target_branch": g.branch,
			"triage_result": map[string]any{"resolution": g.agent, "data": map[string]any{"jira_issue": key}}}
	}
	for k, v := range meta {
		set[k] = v
	}
	for k, v := range set {
		if err := task.Set(k, v); err != nil {
			return "", err
		}
	}
	msg, err := event.New(event.RequestedEvent(g.agent), key, task, nil)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := event.NewPublisher(s.rdb, 0).PublishID(ctx, topo.Stream(g.agent, g.branch, false), msg)
	if err != nil {
		return "", fmt.Errorf("publish %s for %s: %w", g, key, err)
	}
	return id, nil
}

// startGroups starts n workers for each of gs.
func (s *scenario) startGroups(n int, gs ...group) {
	s.t.Helper()
	for _, g := range gs {
		for i := range n {
			s.startWorker(g, workerName(g, i))
		}
	}
}

// underKills runs feed in a goroutine of its own and, until it returns, SIGKILLs a
// worker (mostly one with a run in flight) every killLo to killHi and restarts it under
// its name after up to 800 ms. Once, when midway has passed, it calls mid (nil: none)
// instead. It returns the kills.
func (s *scenario) underKills(killLo, killHi, midway time.Duration, mid func(), feed func()) int {
	s.t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); feed() }()
	start := time.Now()
	kills := 0
	for {
		select {
		case <-done:
			return kills
		case <-time.After(randDur(killLo, killHi)):
		}
		if mid != nil && time.Since(start) > midway {
			mid()
			mid = nil
			continue
		}
		w := s.pickVictim()
		s.kill(w)
		kills++
		time.Sleep(randDur(0, 800*time.Millisecond)) // the restart's random downtime
		s.startWorker(w.g, w.name)
	}
}

// conflictsAcrossAgents counts the conflict records (lock.dropped, lock.delayed...)
// whose busy key was a shared one (scope) held by another agent's run.
func conflictsAcrossAgents(s *scenario, scope string) int {
	st, err := s.snapshot(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	n := 0
	for _, m := range st.results {
		if str(m.Values["scope"]) == scope && str(m.Values["holder_agent"]) != "" &&
			str(m.Values["holder_agent"]) != str(m.Values["agent"]) {
			n++
		}
	}
	return n
}

// TestScopeIssueAcrossAgentsUnderKills (issue 23's done-when): rebase and backport
// workers, two processes each, with LOCK_SCOPE=issue; 200 requests for eight issues,
// spread over both agents, while a random worker is SIGKILLed every 0.7 to 1.5 s and
// restarted; a busy event is dropped (delay under shared keys: TestScopeGroupAcrossProcesses).
// The ledger shows no two runs of one issue at once, whichever their agents, and every
// event ends with one terminal record.
func TestScopeIssueAcrossAgentsUnderKills(t *testing.T) {
	o := defaultOptions()
	o.fetcher = false
	o.runnerMin, o.runnerMax = 50, 250
	o.workerArgs = func(group) []string {
		return []string{"--lock-scope", "issue", "--on-conflict", "drop"}
	}
	s := newScenario(t, o)
	rebase, backport := group{"rebase", "c9s"}, group{"backport", "c9s"}
	s.startGroups(2, rebase, backport)
	issues := []string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-4", "RHEL-5", "RHEL-6", "RHEL-7", "RHEL-8"}
	s.seedJira(issues...)

	const events = 200
	published := 0
	start := time.Now()
	kills := s.underKills(700*time.Millisecond, 1500*time.Millisecond, 0, nil, func() {
		// About 150 ticks: one in three publishes both agents' requests for one issue
		// at once.
		for published < events {
			key := issues[rand.IntN(len(issues))]
			gs := []group{rebase, backport}
			rand.Shuffle(2, func(i, j int) { gs[i], gs[j] = gs[j], gs[i] })
			if rand.IntN(3) != 0 || published == events-1 {
				gs = gs[:1]
			}
			for _, g := range gs {
				if _, err := s.publish(g, key, nil); err != nil {
					t.Error(err)
					return
				}
				published++
			}
			time.Sleep(80 * time.Millisecond) // the feed's pace
		}
	})
	end := s.waitSettled(2 * time.Minute)
	rep := s.checkInvariants(checkOptions{crashDuplicates: true, noLabels: true,
		exclusive: func(r run) []string { return []string{"issue " + r.issue} }})
	runs, _ := s.runs()
	killed := 0
	for _, r := range runs {
		if r.how == "killed" {
			killed++
		}
	}
	across := conflictsAcrossAgents(s, "issue")
	// Without a conflict across agents the overlap check proves nothing.
	if across == 0 {
		t.Errorf("no event met the other agent's run of its issue: the scenario did not test the scope")
	}
	t.Logf("FIGURE scope-issue: %d requests (busy: drop) for %d issues, %d SIGKILLs "+
		"(%d runs interrupted), settled in %s: %d runs, none overlapping on an issue; %d conflicts with the other "+
		"agent's run; %s", published, len(issues), kills, killed, end.Sub(start).Round(time.Millisecond), len(runs),
		across, rep)
}

// TestBusyPoliciesMixedUnderKills (issues 23 and 24): one ON_CONFLICT table gives each
// event type its policy (triage drop, rebase coalesce, backport delay:300ms:2s, rebuild
// deliver with a mailbox of 4; runners acknowledge about half of the follow-ups they
// read; rebase on c10s, on issues of its own, supersede), requests come in bursts on a
// few issues, and a random worker is SIGKILLed every 1 to 2 s. Halfway, every backport worker is SIGKILLed at once while events wait in the
// delayed set, and restarted only after they are due. Every event ends with one terminal
// record, every delayed copy is appended once and never runs early, every follow-up is
// accounted for (delivered to a live run, rolled into the next run, or dead-lettered),
// every superseded event names a newer one, and a superseded run ends before the newer
// one starts (the ledger).
func TestBusyPoliciesMixedUnderKills(t *testing.T) {
	o := defaultOptions()
	o.fetcher = false
	o.runnerMin, o.runnerMax = 150, 600
	o.runnerEnv = []string{"RUNNER_ACK_MAILBOX=1"}
	const minDelay = 300 * time.Millisecond
	triage := group{agent: "triage"}
	rebase, backport, rebuild := group{"rebase", "c9s"}, group{"backport", "c9s"}, group{"rebuild", "c9s"}
	// supersede has a group of its own: rebase on c10s, on issues no other rebase worker
	// sees (the lease of rebase on an issue is one across branches, and all workers of
	// one agent on one issue should share ON_CONFLICT).
	newest := group{"rebase", "c10s"}
	o.workerArgs = func(g group) []string {
		rebasePolicy := "coalesce"
		if g == newest {
			rebasePolicy = "supersede"
		}
		return []string{"--on-conflict", "triage.requested=drop,rebase.requested=" + rebasePolicy + ",backport.requested=delay:300ms:2s," +
			"rebuild.requested=deliver", "--mailbox-depth", "4"}
	}
	s := newScenario(t, o)
	s.startGroups(1, triage)
	s.startGroups(2, rebase, backport, rebuild, newest)
	// Downstream issues (RHEL-22 fails: retried, then dead-lettered); triage issues are
	// resolved not-affected or postponed (N%20 is 0 or 1), so triage publishes nothing
	// downstream, and each gets one burst: a run and the events dropped beside it.
	downstream := []string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-22"}
	superseded := []string{"RHEL-7", "RHEL-8"}
	var triageIssues []string
	for n := 20; n <= 400; n += 20 {
		triageIssues = append(triageIssues, fmt.Sprintf("RHEL-%d", n), fmt.Sprintf("RHEL-%d", n+1))
	}
	s.seedJira(append(append(slices.Clone(downstream), superseded...), triageIssues...)...)

	published := map[string]int{}
	burst := func(g group, key string) error {
		n := 1 + rand.IntN(3)
		if g == rebuild {
			n = 1 + rand.IntN(5) // now and then more than the mailbox holds
		}
		for range n {
			if _, err := s.publish(g, key, nil); err != nil {
				return err
			}
			published[g.String()]++
		}
		return nil
	}
	var restartGap time.Duration
	var delayedAtKill int64
	start := time.Now()
	kills := s.underKills(time.Second, 2*time.Second, 5*time.Second, func() {
		// Every backport worker dies with events in the delayed set; none is promoted
		// until a worker of the stream is back, after they are all due.
		delayedAtKill, restartGap = s.killGroupPastDelays(backport, 2500*time.Millisecond)
	}, func() {
		for i := range 90 {
			var err error
			switch g := []group{triage, rebase, backport, rebuild, newest}[i%5]; {
			case g == triage && i%10 == 0:
				err = burst(g, triageIssues[i/10])
			case g == rebuild:
				err = burst(g, downstream[rand.IntN(2)])
			case g == newest:
				err = burst(g, superseded[rand.IntN(2)])
			case g != triage && rand.IntN(3) != 0:
				err = burst(g, downstream[rand.IntN(len(downstream))])
			}
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(120 * time.Millisecond) // the feed's pace
		}
	})
	end := s.waitSettled(2 * time.Minute)
	rep := s.checkInvariants(checkOptions{crashDuplicates: true, noLabels: true, minDelay: minDelay})
	if delayedAtKill == 0 {
		t.Errorf("no event was delayed when every backport worker was killed: the restart proved nothing")
	}

	byType := map[string]int{}
	st, err := s.snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.results {
		byType[str(m.Values["event_type"])]++
	}
	for _, et := range []string{event.LockDropped, event.LockCoalesced, event.LockDelayed, event.LockDelivered, event.FollowupRolled,
		event.LockSuperseded} {
		if byType[et] == 0 {
			t.Errorf("no %s record: the scenario did not exercise that policy (records by type: %v)", et, byType)
		}
	}
	runs, _ := s.runs()
	cancelled := 0
	for _, r := range runs {
		if r.agent == newest.agent && r.branch == newest.branch && r.how == "term" {
			cancelled++
		}
	}
	mailboxFull := 0
	for _, d := range st.dead {
		if strings.Contains(fmt.Sprint(d.Values), "mailbox") {
			mailboxFull++
		}
	}
	t.Logf("FIGURE policies: published %v with %d SIGKILLs, settled in %s; all backport workers killed with %d events "+
		"delayed and restarted %s later; records by type %v; %d follow-ups dead-lettered at the mailbox's depth; "+
		"%d rebase runs on c10s cancelled by a newer event; %s",
		published, kills, end.Sub(start).Round(time.Millisecond), delayedAtKill, restartGap.Round(time.Millisecond),
		byType, mailboxFull, cancelled, rep)
}

// killGroupPastDelays SIGKILLs every live worker of g, waits gap (longer than the
// longest delay), and starts them again. It returns how many events were in g's delayed
// set at the kill, and how long the group was down.
func (s *scenario) killGroupPastDelays(g group, gap time.Duration) (int64, time.Duration) {
	s.t.Helper()
	ctx := context.Background()
	key := delayq.Key(topo.Stream(g.agent, g.branch, false))
	// Wait (briefly) for something delayed, so that the kill has something to lose
	// (the feed keeps publishing).
	deadline := time.Now().Add(5 * time.Second)
	for s.rdb.ZCard(ctx, key).Val() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling the delayed set
	}
	var victims []*worker
	for _, w := range s.alive() {
		if w.g == g {
			victims = append(victims, w)
		}
	}
	for _, w := range victims {
		s.kill(w)
	}
	down := time.Now()
	n := s.rdb.ZCard(ctx, key).Val()
	time.Sleep(gap)
	for _, w := range victims {
		s.startWorker(w.g, w.name)
	}
	return n, time.Since(down)
}

// TestScopeGroupAcrossProcesses (issue 23): rebase and backport workers, five processes,
// each run holding three keys at once (LOCK_SCOPE issue and group:metadata.component,
// besides its agent's), contend for twelve issues of three packages, busy events
// delayed, while a worker is SIGKILLed now and then. The ledger shows no two runs of one
// package (on different issues) or of one issue at once, runs of different packages at
// once, and everything settles: the all-or-nothing acquire of overlapping key sets never
// deadlocks.
func TestScopeGroupAcrossProcesses(t *testing.T) {
	o := defaultOptions()
	o.fetcher = false
	o.runnerMin, o.runnerMax = 150, 400
	o.workerArgs = func(group) []string {
		return []string{"--lock-scope", "issue,group:metadata.component", "--on-conflict", "delay:150ms:600ms"}
	}
	s := newScenario(t, o)
	rebase, backport := group{"rebase", "c9s"}, group{"backport", "c9s"}
	s.startGroups(2, rebase)
	s.startGroups(3, backport)
	component := map[string]string{}
	var issues []string
	for i, c := range []string{"openssl", "curl", "glibc"} {
		for n := range 4 {
			k := fmt.Sprintf("RHEL-%d", 4*i+n+1)
			issues = append(issues, k)
			component[k] = c
		}
	}
	s.seedJira(issues...)

	const events = 60
	start := time.Now()
	kills := s.underKills(2*time.Second, 3*time.Second, 0, nil, func() {
		for range events {
			key := issues[rand.IntN(len(issues))]
			if _, err := s.publish([]group{rebase, backport}[rand.IntN(2)], key, map[string]any{"component": component[key]}); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Millisecond) // the feed's pace
		}
	})
	// Everything settles: a deadlock would leave events pending.
	end := s.waitSettled(time.Minute)
	rep := s.checkInvariants(checkOptions{crashDuplicates: true, noLabels: true, minDelay: 150 * time.Millisecond,
		exclusive: func(r run) []string { return []string{"issue " + r.issue, "package " + component[r.issue]} }})

	// Other packages ran in parallel: pairs of runs of different packages that overlap.
	runs, _ := s.runs()
	parallel := 0
	for i, a := range runs {
		for _, b := range runs[i+1:] {
			if component[a.issue] != component[b.issue] && a.start.Before(b.end) && b.start.Before(a.end) {
				parallel++
			}
		}
	}
	if parallel == 0 {
		t.Errorf("no two runs of different packages ran at once: the group key serialised more than its package")
	}
	sameGroup := 0
	st, err := s.snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.results {
		if str(m.Values["scope"]) == "group" && str(m.Values["holder_issue"]) != str(m.Values["issue_key"]) {
			sameGroup++
		}
	}
	if sameGroup == 0 {
		t.Errorf("no event met a run of another issue of its package: the scenario did not test the group key")
	}
	t.Logf("FIGURE scope-group: %d requests for %d issues of 3 packages (LOCK_SCOPE issue,group:metadata.component), "+
		"%d SIGKILLs, settled in %s: %d runs, none overlapping within a package or an issue, %d overlapping pairs "+
		"across packages; %d conflicts with another issue of the package; %s", events, len(issues), kills,
		end.Sub(start).Round(time.Millisecond), len(runs), parallel, sameGroup, rep)
}
