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
	o := defaultOptions()
	o.cluster = cluster
	o.fetcher, o.noFail = false, true // no simulated failures: each request runs to its end once
	o.runnerMin, o.runnerMax = 100, 300
	s := newScenario(t, o)
	g := group{"rebase", "c9s"}
	stream := topo.Stream(g.agent, g.branch, false)
	s.startGroups(3, g)
	component := map[string]string{}
	var issues, curl []string
	for n := range 8 {
		for i, c := range []string{"openssl", "curl", "glibc"} {
			k := fmt.Sprintf("RHEL-%d", 3*n+i+1)
			issues = append(issues, k)
			component[k] = c
			if c == "curl" {
				curl = append(curl, k)
			}
		}
	}
	s.seedJira(issues...)
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(binary, append(args, "--redis-url", s.url, "--log-level", "warn")...)
		cmd.Env = append(s.baseEnv(), "YMIR_OPERATOR=tester")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ymirflow %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	published := map[string]string{} // issue -> entry id
	var pausedAt time.Time
	var running []string // the curl issues pause named as running (past their check)
	for i, k := range issues {
		if i == 6 {
			// Under load: two curl requests published before the pause.
			out := cli("pause", "field:metadata.component=curl", "--reason", "curl upgrade")
			pausedAt = time.Now()
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) > 3 && f[0] == "running," {
					running = append(running, f[3])
				}
			}
		}
		id, err := s.publish(g, k, map[string]any{"component": component[k]})
		if err != nil {
			t.Fatal(err)
		}
		published[k] = id
		if i == 8 || i == 16 {
			if alive := s.alive(); len(alive) > 0 {
				s.kill(alive[0])
				s.startWorker(g, workerName(g, 3+i))
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
	ctx := context.Background()
	doneOf := func() map[string]int {
		n := map[string]int{}
		runs, _ := s.runs()
		for _, r := range runs {
			if r.how == "ok" {
				n[r.issue]++
			}
		}
		return n
	}
	tag := topo.LockScope() + "pause"
	if cluster {
		tag = "{" + tag + "}"
	}
	lineKey := "lockpauseline:" + tag + ":field:metadata.component=curl"
	waitFor(t, 60*time.Second, "the other components to run and curl to wait", func() (bool, string) {
		d := doneOf()
		for _, k := range issues {
			if component[k] != "curl" && d[k] < 1 {
				return false, k + " has not run yet"
			}
		}
		ranBefore := 0
		for _, k := range curl {
			ranBefore += d[k]
		}
		// At least: a run that ended as a SIGKILL landed between its release and its ack
		// (Cluster: two steps) is redelivered and parks, a crash duplicate as in
		// checkOptions.crashDuplicates (checked below).
		if w := s.rdb.ZCard(ctx, lineKey).Val(); w+int64(ranBefore) < int64(len(curl)) {
			return false, fmt.Sprintf("%d curl requests wait in the pause's line and %d ran, want %d in all", w, ranBefore, len(curl))
		}
		return true, ""
	})
	waiting := s.rdb.ZCard(ctx, lineKey).Val()
	if out := cli("locks"); !strings.Contains(out, "PAUSED field:metadata.component=curl") || !strings.Contains(out, fmt.Sprintf("%d waiting", waiting)) {
		t.Errorf("locks does not show the pause:\n%s", out)
	}
	runs, _ := s.runs()
	for _, r := range runs {
		// A run past its check when the pause was written is named by pause (and
		// finishes); no other curl run starts after the pause.
		if component[r.issue] == "curl" && r.start.After(pausedAt) && !slices.Contains(running, r.issue) {
			t.Errorf("a curl run started while curl was paused (since %s): %s", pausedAt.Format("15:04:05.000"), r)
		}
	}
	resumedAt := time.Now()
	cli("resume", "field:metadata.component=curl", "--reason", "upgrade done")
	waitFor(t, 60*time.Second, "every request to have run", func() (bool, string) {
		d := doneOf()
		for _, k := range issues {
			if d[k] < 1 {
				return false, k + " has not run yet"
			}
		}
		return true, ""
	})
	// None twice (a run to its end once per request), none lost (above), and the copies
	// in the stream in the order of their requests.
	runs, _ = s.runs()
	dups := 0 // crash duplicates, for the figure
	for k, n := range doneOf() {
		if n == 2 && s.crashDuplicate(runs, k) {
			dups++
			continue
		}
		if n != 1 {
			t.Errorf("%s ran to its end %d times", k, n)
		}
	}
	entries, err := s.rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range entries {
		if from := str(e.Values["m:"+lease.MetaParkedFrom]); from != "" {
			order = append(order, from)
		}
	}
	if int64(len(order)) != waiting || !slices.IsSortedFunc(order, streamid.Compare) {
		t.Errorf("the resumed copies, by their first entry: %v; want the %d curl requests that waited, in stream order", order, waiting)
	}
	if out := cli("pause", "--list"); !strings.Contains(out, "no active pauses") {
		t.Errorf("pause --list after the resume:\n%s", out)
	}
	t.Logf("FIGURE pause: 24 requests of 3 components, curl paused after 6 (%d curl runs under way then), 2 SIGKILLs: "+
		"no curl run started during the pause; resume appended %d in order, all 24 ran once (%d crash duplicates), the last %s after the resume",
		len(running), len(order), dups, time.Since(resumedAt).Round(time.Millisecond))
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
