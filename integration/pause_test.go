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
// Three rebase workers; `ymirflow pause field:metadata.component=curl`; then 24
// requests of 24 issues (8 each of openssl, curl and glibc, interleaved) while a worker
// is SIGKILLed and replaced twice. The other components all run to their end and no
// curl request starts; the 8 wait in the pause's line. `ymirflow resume`: the 8 are
// appended again in their stream order, and each runs to its end exactly once.
func TestPauseOneComponentUnderKills(t *testing.T) {
	o := defaultOptions()
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
	cli("pause", "field:metadata.component=curl", "--reason", "curl upgrade")
	pausedAt := time.Now()
	published := map[string]string{} // issue -> entry id
	for i, k := range issues {
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
	lineKey := "lockpauseline:" + topo.LockScope() + "pause:field:metadata.component=curl"
	waitFor(t, 60*time.Second, "the other components to run and curl to wait", func() (bool, string) {
		d := doneOf()
		for _, k := range issues {
			if component[k] != "curl" && d[k] < 1 {
				return false, k + " has not run yet"
			}
		}
		if w := s.rdb.ZCard(ctx, lineKey).Val(); w != int64(len(curl)) {
			return false, fmt.Sprintf("%d curl requests wait in the pause's line, want %d", w, len(curl))
		}
		return true, ""
	})
	if out := cli("locks"); !strings.Contains(out, "PAUSED field:metadata.component=curl") || !strings.Contains(out, "8 waiting") {
		t.Errorf("locks does not show the pause:\n%s", out)
	}
	runs, _ := s.runs()
	for _, r := range runs {
		if component[r.issue] == "curl" {
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
	for k, n := range doneOf() {
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
	if len(order) != len(curl) || !slices.IsSortedFunc(order, streamid.Compare) {
		t.Errorf("the resumed copies, by their first entry: %v; want the %d curl requests in stream order", order, len(curl))
	}
	for _, k := range curl {
		if !slices.Contains(order, published[k]) {
			t.Errorf("%s (%s) was not appended again by the resume", k, published[k])
		}
	}
	if out := cli("pause", "--list"); !strings.Contains(out, "no active pauses") {
		t.Errorf("pause --list after the resume:\n%s", out)
	}
	t.Logf("FIGURE pause: 24 requests of 3 components, curl paused, 2 SIGKILLs: 16 ran during the pause, 0 of curl; "+
		"resume appended %d in order, all ran once within %s", len(order), time.Since(resumedAt).Round(time.Millisecond))
}
