package integration

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
)

// Issue 37 item 2, done when: 3 worker processes with a limit of 2 runs of the agent at
// once: never more than 2 runs at once (the ledger), and while one component floods
// 200 events, 5 quiet components with 5 events each all start within their fair share
// (p95 start latency per component, Jain's fairness index over the quiet ones >= 0.9);
// a :todo event starts before the batch backlog. One worker is SIGKILLed while the
// flood waits: its slot frees at its lease's expiry, and nothing is lost.
//
// Each event is its own issue (the component is the issue's project: BIG-n, QA-n...),
// so no lease is ever busy: every wait is for a slot. Runs are short no-ops.
func TestRunLimitsFairUnderKills(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { runLimitsFair(t, false, 200) })
	// A smaller flood on the cluster: at 2 runs at once each run costs the whole pipeline's
	// round (runner, Jira labels, results), and the test keeps to its time budget.
	t.Run("cluster", func(t *testing.T) { runLimitsFair(t, true, 60) })
}

var quietComponents = []string{"QA", "QB", "QC", "QD", "QE"}

// published is when each issue's event was published, by issue key.
type published struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (p *published) set(key string, t time.Time) {
	p.mu.Lock()
	p.at[key] = t
	p.mu.Unlock()
}

func runLimitsFair(t *testing.T, cluster bool, flood int) {
	o := defaultOptions()
	o.cluster = cluster
	o.noFail, o.fetcher = true, false
	o.runnerMin, o.runnerMax = 5, 10
	o.workerArgs = func(group) []string {
		return []string{"--run-limits", "rebase=2,fair:metadata.component", "--read-batch", "1"}
	}
	s := newScenario(t, o)
	g := group{agent: "rebase", branch: "c9s"}
	var keys []string
	for i := 1; i <= flood; i++ {
		keys = append(keys, fmt.Sprintf("BIG-%d", i))
	}
	for _, c := range quietComponents {
		for i := 1; i <= 5; i++ {
			keys = append(keys, fmt.Sprintf("%s-%d", c, i))
		}
	}
	keys = append(keys, "TODO-1")
	s.seedJira(keys...)
	for i := range 3 {
		s.startWorker(g, workerName(g, i))
	}
	pub := &published{at: map[string]time.Time{}}
	for _, k := range keys[:flood] {
		s.publishLimited(t, g, k, false, pub)
	}
	// The flood is in the line; the quiet components come now, interleaved.
	waitFor(t, 30*time.Second, "the flood to wait", func() (bool, string) {
		runs, _ := s.runs()
		return len(runs) >= 4, fmt.Sprintf("%d runs", len(runs))
	})
	for i := 1; i <= 5; i++ {
		for _, c := range quietComponents {
			s.publishLimited(t, g, fmt.Sprintf("%s-%d", c, i), false, pub)
		}
	}
	waitFor(t, 30*time.Second, "some quiet runs", func() (bool, string) {
		runs, _ := s.runs()
		return len(runs) >= 20, fmt.Sprintf("%d runs", len(runs))
	})
	// One worker dies with its run (its slot held until its lease would have expired).
	// The events it had read die in its hands: they wait for their leases' expiry and a
	// claim, whatever the fair order, so they have the kill's bound, not the line's.
	victim := s.pickVictim()
	killAt := s.kill(victim)
	stranded := s.heldBy(t, g, victim.name)
	s.startWorker(g, workerName(g, 3))
	todoAt := time.Now()
	s.publishLimited(t, g, "TODO-1", true, pub)
	waitFor(t, 90*time.Second, "every event to have run", func() (bool, string) {
		runs, _ := s.runs()
		ok := map[string]bool{}
		for _, r := range runs {
			if r.how == "ok" {
				ok[r.issue] = true
			}
		}
		return len(ok) == len(keys), fmt.Sprintf("%d of %d events ran to their end", len(ok), len(keys))
	})
	runs, bad := s.runs()
	for _, b := range bad {
		t.Error(b)
	}
	checkAtMost(t, runs, 2)
	// Its lease's expiry, the claim, and a turn in its (short) lane of the line.
	k := kill{at: killAt, stranded: stranded, within: o.tm.LockTTL + o.tm.MaxIdle + 3*o.tm.Claim + 2*time.Second}
	for _, late := range checkFairness(t, runs, pub, k) {
		s.explain(late, pub.at[late], runs)
	}
	checkTodoFirst(t, runs, todoAt)
}

// explain logs what the scenario knows of one issue: its publish, its runs, the kills,
// and every worker's log lines that name it.
func (s *scenario) explain(issue string, published time.Time, runs []run) {
	s.t.Helper()
	lines := []string{"published " + published.Format("15:04:05.000")}
	for _, r := range runs {
		if r.issue == issue {
			lines = append(lines, "run: "+r.String())
		}
	}
	s.mu.Lock()
	for pid, at := range s.kills {
		lines = append(lines, fmt.Sprintf("worker %d SIGKILLed at %s", pid, at.Format("15:04:05.000")))
	}
	ws := slices.Clone(s.all)
	s.mu.Unlock()
	for _, w := range ws {
		for _, l := range logLines(w, `"`+issue+`"`) {
			lines = append(lines, fmt.Sprintf("worker %s (pid %d): %s", w.name, w.pid, l))
		}
	}
	s.t.Logf("%s:\n  %s", issue, strings.Join(lines, "\n  "))
}

// publishLimited publishes key's request to g's input stream (todo: its :todo twin),
// its component the key's project.
func (s *scenario) publishLimited(t *testing.T, g group, key string, todo bool, pub *published) {
	t.Helper()
	task := event.Task{UserTriggered: todo}
	comp, _, _ := strings.Cut(key, "-")
	for k, v := range map[string]any{"jira_issue": key, "target_branch": g.branch, "component": comp,
		"triage_result": map[string]any{"resolution": g.agent, "data": map[string]any{"jira_issue": key}}} {
		if err := task.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := event.New(event.RequestedEvent(g.agent), key, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub.set(key, time.Now())
	if _, err := event.NewPublisher(s.rdb, 0).PublishID(ctx, topo.Stream(g.agent, g.branch, todo), msg); err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
}

// checkAtMost checks that no more than n runs overlap (a killed run ends at its kill).
func checkAtMost(t *testing.T, runs []run, n int) {
	t.Helper()
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, r := range runs {
		end := r.end
		if end.IsZero() {
			end = time.Now()
		}
		edges = append(edges, edge{r.start, 1}, edge{end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta // an end before a start at the same instant
		}
		return edges[i].at.Before(edges[j].at)
	})
	cur, most := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	if most > n {
		t.Errorf("%d runs at once, limit %d", most, n)
	}
	t.Logf("%d runs, at most %d at once (limit %d)", len(runs), most, n)
}

// heldBy returns the issues of the entries that consumer (a worker's name) has pending
// in g's input streams: the events a SIGKILLed worker had read.
func (s *scenario) heldBy(t *testing.T, g group, consumer string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held := map[string]bool{}
	for _, todo := range []bool{false, true} {
		stream := topo.Stream(g.agent, g.branch, todo)
		pending, err := s.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: g.String(),
			Start: "-", End: "+", Count: 1000}).Result()
		if err != nil && !strings.HasPrefix(err.Error(), "NOGROUP") {
			t.Fatalf("XPENDING %s: %v", stream, err)
		}
		for _, p := range pending {
			if p.Consumer != consumer && !strings.HasPrefix(p.Consumer, consumer+"-") {
				continue
			}
			msgs, err := s.rdb.XRange(ctx, stream, p.ID, p.ID).Result()
			if err != nil {
				t.Fatalf("XRANGE %s %s: %v", stream, p.ID, err)
			}
			for _, m := range msgs {
				held[str(m.Values["m:"+event.MetaIssueKey])] = true
			}
		}
	}
	t.Logf("the SIGKILLed worker %s held %d events: %v", consumer, len(held), slices.Sorted(maps.Keys(held)))
	return held
}

// kill is the scenario's SIGKILL: when, the events its worker held, and the bound on
// a held quiet event's start after it (its lease's expiry, a claim, a turn in its lane).
type kill struct {
	at       time.Time
	stranded map[string]bool
	within   time.Duration
}

// checkFairness reports the p95 start latency (publish to first start) per component,
// and requires Jain's fairness index over the quiet components' mean latencies to be
// at least 0.9 and every quiet event to start before the flood's median one. An event
// the kill stranded before its start is left out of both: a quiet one must start within
// k.within of the kill instead (a flood event waits in the flood's lane once claimed, as
// the rest of the flood does). It returns the events that started late.
func checkFairness(t *testing.T, runs []run, pub *published, k kill) (late []string) {
	t.Helper()
	first := map[string]time.Time{}
	for _, r := range runs {
		if f, ok := first[r.issue]; !ok || r.start.Before(f) {
			first[r.issue] = r.start
		}
	}
	for issue := range k.stranded {
		at, ok := first[issue]
		if !ok || at.Before(k.at) {
			continue // its run was the one killed: it started in its turn
		}
		t.Logf("event %s, held by the SIGKILLed worker, started %s after the kill", issue, at.Sub(k.at).Round(time.Millisecond))
		if comp, _, _ := strings.Cut(issue, "-"); slices.Contains(quietComponents, comp) && at.After(k.at.Add(k.within)) {
			t.Errorf("event %s, held by the SIGKILLed worker, started %s after the kill (bound: %s, its lease's expiry and a claim)",
				issue, at.Sub(k.at).Round(time.Millisecond), k.within)
			late = append(late, issue)
		}
		delete(first, issue)
	}
	lat := map[string][]time.Duration{}
	for issue, at := range first {
		comp, _, _ := strings.Cut(issue, "-")
		lat[comp] = append(lat[comp], at.Sub(pub.at[issue]))
	}
	var means []float64
	for _, c := range append([]string{"BIG"}, quietComponents...) {
		l := lat[c]
		slices.Sort(l)
		if len(l) == 0 {
			t.Errorf("component %s: no run", c)
			continue
		}
		var sum time.Duration
		for _, d := range l {
			sum += d
		}
		p95 := l[min(len(l)-1, int(math.Ceil(0.95*float64(len(l))))-1)]
		t.Logf("component %s: %d events, p95 start latency %s, mean %s", c, len(l), p95.Round(time.Millisecond),
			(sum / time.Duration(len(l))).Round(time.Millisecond))
		if c != "BIG" {
			means = append(means, float64(sum)/float64(len(l)))
		}
	}
	var s, sq float64
	for _, m := range means {
		s += m
		sq += m * m
	}
	jain := s * s / (float64(len(means)) * sq)
	t.Logf("Jain's fairness index over the quiet components' mean start latency: %.3f", jain)
	if jain < 0.9 {
		t.Errorf("Jain's fairness index %.3f < 0.9", jain)
	}
	var big []time.Time
	for issue, at := range first {
		if strings.HasPrefix(issue, "BIG-") {
			big = append(big, at)
		}
	}
	slices.SortFunc(big, func(a, b time.Time) int { return a.Compare(b) })
	median := big[len(big)/2]
	for issue, at := range first {
		comp, _, _ := strings.Cut(issue, "-")
		if slices.Contains(quietComponents, comp) && at.After(median) {
			t.Errorf("quiet event %s started at %s, after the flood's median start %s: not its fair share",
				issue, at.Format("15:04:05.000"), median.Format("15:04:05.000"))
			late = append(late, issue)
		}
	}
	return late
}

// checkTodoFirst requires the :todo event to start before the flood that waited when
// it was published: at most a few flood runs start in between (the slots already handed
// to their copies, and one freeing by the killed worker's expiry).
func checkTodoFirst(t *testing.T, runs []run, todoAt time.Time) {
	t.Helper()
	var todoStart time.Time
	waiting := 0
	for _, r := range runs {
		if r.issue == "TODO-1" && (todoStart.IsZero() || r.start.Before(todoStart)) {
			todoStart = r.start
		}
	}
	between := 0
	for _, r := range runs {
		if !strings.HasPrefix(r.issue, "BIG-") {
			continue
		}
		if r.start.After(todoAt) && r.start.Before(todoStart) {
			between++
		}
		if r.start.After(todoStart) {
			waiting++
		}
	}
	t.Logf(":todo event started %s after its publish; %d flood runs started in between, %d after it",
		todoStart.Sub(todoAt).Round(time.Millisecond), between, waiting)
	if between > 4 {
		t.Errorf("%d flood runs started between the :todo event's publish and its start", between)
	}
	if waiting < 10 {
		t.Errorf("only %d flood runs started after the :todo event: the test did not catch a backlog", waiting)
	}
}
