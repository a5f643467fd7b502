package integration

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Issue 38, done when: pause one component during a load of several: zero new runs for
// it, the others unaffected; resume: its events run in order, none twice, none lost,
// with workers SIGKILLed during the pause.
//
// Three rebase workers, 24 requests of 24 issues (8 each of openssl, curl and glibc,
// interleaved); after the sixth, `ymirflow pause field:metadata.component=curl`, while
// a worker is SIGKILLed and replaced twice. The other components all run to their end;
// no curl run starts after the pause but those pause named as under way (past their
// check); the others wait in the pause's line. `ymirflow resume`: they are appended
// again in their stream order, and each request runs to its end exactly once.
func TestPauseOneComponentUnderKills(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { pauseOneComponent(t, false) })
	t.Run("cluster", func(t *testing.T) { pauseOneComponent(t, true) })
}

func pauseOneComponent(t *testing.T, cluster bool) {
	p := newPauseLoad(t, cluster)
	// 1. The load, with the pause after the sixth request and two SIGKILLs.
	p.publishAndPause(t)
	// 2. During the pause: the others run, curl waits in the pause's line.
	p.checkPaused(t)
	// 3. The resume: every request runs to its end once, in stream order.
	resumedAt := time.Now()
	p.cli(t, "resume", "field:metadata.component=curl", "--reason", "upgrade done")
	order, dups := p.checkResumed(t)
	t.Logf("FIGURE pause: 24 requests of 3 components, curl paused after 6 (%d curl runs under way then), 2 SIGKILLs: "+
		"no curl run started during the pause; resume appended %d in order, all 24 ran once (%d crash duplicates), the last %s after the resume",
		len(p.running), len(order), dups, time.Since(resumedAt).Round(time.Millisecond))
}

// pauseLoad is the scenario of pauseOneComponent, the phases of which are its methods.
type pauseLoad struct {
	s         *scenario
	g         group
	stream    string
	component map[string]string // issue -> component
	issues    []string
	curl      []string
	pausedAt  time.Time
	running   []string // the curl issues pause named as running (past their check)
	lineKey   string   // the pause's wait line
	waiting   int64    // how many waited in it, read during the pause
}

// newPauseLoad starts three rebase workers and seeds 24 issues of 3 components, interleaved.
func newPauseLoad(t *testing.T, cluster bool) *pauseLoad {
	o := defaultOptions()
	o.cluster = cluster
	o.fetcher, o.noFail = false, true // no simulated failures: each request runs to its end once
	o.runnerMin, o.runnerMax = 100, 300
	p := &pauseLoad{s: newScenario(t, o), g: group{"rebase", "c9s"}, component: map[string]string{}}
	p.stream = topo.Stream(p.g.agent, p.g.branch, false)
	p.s.startGroups(3, p.g)
	for n := range 8 {
		for i, c := range []string{"openssl", "curl", "glibc"} {
			k := fmt.Sprintf("RHEL-%d", 3*n+i+1)
			p.issues = append(p.issues, k)
			p.component[k] = c
			if c == "curl" {
				p.curl = append(p.curl, k)
			}
		}
	}
	p.s.seedJira(p.issues...)
	tag := topo.LockScope() + "pause"
	if cluster {
		tag = "{" + tag + "}"
	}
	p.lineKey = "lockpauseline:" + tag + ":field:metadata.component=curl"
	return p
}

// cli runs the ymirflow binary as the operator "tester" and returns its output.
func (p *pauseLoad) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary, append(args, "--redis-url", p.s.url, "--log-level", "warn")...)
	cmd.Env = append(p.s.baseEnv(), "YMIR_OPERATOR=tester")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ymirflow %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// publishAndPause publishes the 24 requests, pauses curl before the seventh and
// SIGKILLs a worker (replacing it) after the ninth and the seventeenth.
func (p *pauseLoad) publishAndPause(t *testing.T) {
	s := p.s
	for i, k := range p.issues {
		if i == 6 {
			// Under load: two curl requests published before the pause.
			out := p.cli(t, "pause", "field:metadata.component=curl", "--reason", "curl upgrade")
			p.pausedAt = time.Now()
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) > 3 && f[0] == "running," {
					p.running = append(p.running, f[3])
				}
			}
		}
		if _, err := s.publish(p.g, k, map[string]any{"component": p.component[k]}); err != nil {
			t.Fatal(err)
		}
		if i == 8 || i == 16 {
			if alive := s.alive(); len(alive) > 0 {
				s.kill(alive[0])
				s.startWorker(p.g, workerName(p.g, 3+i))
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// doneOf counts each issue's runs to their end.
func (p *pauseLoad) doneOf() map[string]int {
	n := map[string]int{}
	runs, _ := p.s.runs()
	for _, r := range runs {
		if r.how == "ok" {
			n[r.issue]++
		}
	}
	return n
}

// checkPaused waits for the other components to run and curl to wait, then checks
// that locks shows the pause and that no curl run started after it.
func (p *pauseLoad) checkPaused(t *testing.T) {
	ctx := context.Background()
	waitFor(t, 60*time.Second, "the other components to run and curl to wait", func() (bool, string) {
		d := p.doneOf()
		for _, k := range p.issues {
			if p.component[k] != "curl" && d[k] < 1 {
				return false, k + " has not run yet"
			}
		}
		ranBefore := 0
		for _, k := range p.curl {
			ranBefore += d[k]
		}
		// At least: a run that ended as a SIGKILL landed between its release and its ack
		// (Cluster: two steps) is redelivered and parks, a crash duplicate as in
		// checkOptions.crashDuplicates (checked below).
		if w := p.s.rdb.ZCard(ctx, p.lineKey).Val(); w+int64(ranBefore) < int64(len(p.curl)) {
			return false, fmt.Sprintf("%d curl requests wait in the pause's line and %d ran, want %d in all", w, ranBefore, len(p.curl))
		}
		return true, ""
	})
	p.waiting = p.s.rdb.ZCard(ctx, p.lineKey).Val()
	if out := p.cli(t, "locks"); !strings.Contains(out, "PAUSED field:metadata.component=curl") || !strings.Contains(out, fmt.Sprintf("%d waiting", p.waiting)) {
		t.Errorf("locks does not show the pause:\n%s", out)
	}
	runs, _ := p.s.runs()
	for _, r := range runs {
		// A run past its check when the pause was written is named by pause (and
		// finishes); no other curl run starts after the pause.
		if p.component[r.issue] == "curl" && r.start.After(p.pausedAt) && !slices.Contains(p.running, r.issue) {
			t.Errorf("a curl run started while curl was paused (since %s): %s", p.pausedAt.Format("15:04:05.000"), r)
		}
	}
}

// checkResumed waits for every request to have run after the resume and checks each
// ran to its end once (but crash duplicates) and the resumed copies are in stream
// order. It returns those copies' first entries and the count of crash duplicates.
func (p *pauseLoad) checkResumed(t *testing.T) (order []string, dups int) {
	s := p.s
	waitFor(t, 60*time.Second, "every request to have run", func() (bool, string) {
		d := p.doneOf()
		for _, k := range p.issues {
			if d[k] < 1 {
				return false, k + " has not run yet"
			}
		}
		return true, ""
	})
	// None twice (a run to its end once per request), none lost (above), and the copies
	// in the stream in the order of their requests.
	runs, _ := s.runs()
	for k, n := range p.doneOf() {
		if n == 2 && s.crashDuplicate(runs, k) {
			dups++ // crash duplicates, for the figure
			continue
		}
		if n != 1 {
			t.Errorf("%s ran to its end %d times", k, n)
		}
	}
	entries, err := s.rdb.XRange(context.Background(), p.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if from := str(e.Values["m:"+lease.MetaParkedFrom]); from != "" {
			order = append(order, from)
		}
	}
	if int64(len(order)) != p.waiting || !slices.IsSortedFunc(order, streamid.Compare) {
		t.Errorf("the resumed copies, by their first entry: %v; want the %d curl requests that waited, in stream order", order, p.waiting)
	}
	if out := p.cli(t, "pause", "--list"); !strings.Contains(out, "no active pauses") {
		t.Errorf("pause --list after the resume:\n%s", out)
	}
	return order, dups
}

// crashDuplicate reports whether issue's two runs to their end are a crash duplicate:
// a worker was SIGKILLed after the first ended and before the second started (the kill
// landed between its release and its ack).
func (s *scenario) crashDuplicate(runs []run, issue string) bool {
	var ends []run
	for _, r := range runs {
		if r.issue == issue && r.how == "ok" {
			ends = append(ends, r)
		}
	}
	if len(ends) != 2 {
		return false
	}
	slices.SortFunc(ends, func(a, b run) int { return a.start.Compare(b.start) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.kills {
		if !at.Before(ends[0].end.Add(-time.Second)) && at.Before(ends[1].start) {
			return true
		}
	}
	return false
}
