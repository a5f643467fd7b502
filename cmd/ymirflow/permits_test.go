package main

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/fakellm"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// permitRate and permitBurst are PERMITS=llm:x=5/s (a burst of 1, as PERMITS sets).
const permitRate, permitBurst = 5, 1

// Issue 39, done when: agents in three worker processes (triage, rebase and backport of
// one issue, each the Python example agent, asking the control channel for a permit of
// llm:x before every call of the fake LLM) stay within PERMITS llm:x=5/s combined, in
// every window of a second; one of them SIGKILLed mid-way changes nothing for the
// others (they go on, within the same limit); a 429 that one agent reports (throttled,
// Retry-After 2 s) pauses all of them for that long, then halves their rate. The fake
// LLM's log of calls stands for the grants: each call follows its permit at once. The
// permits go in turn: each agent has its share, however much slower than the others.
func TestPermitsThreeWorkerProcesses(t *testing.T) {
	// Not parallel: it runs its own processes and times their calls.
	const issue = "RHEL-962"
	w := newControlWorld(t, issue, fakellm.Options{CostUSD: 0.001})
	env := []string{"AGENT_STEPS=400", "AGENT_STEP_USD=0.001", "AGENT_MODEL=x"}
	args := []string{"--permits", "llm:x=5/s"}
	workers := map[string]*proc{
		"triage":   w.worker("triage", "", "wt", env, args...),
		"rebase":   w.worker("rebase", "c9s", "wr", env, args...),
		"backport": w.worker("backport", "c9s", "wb", env, args...),
	}
	w.enqueue("triage", "", issue)
	w.enqueue("rebase", "c9s", issue)
	w.enqueue("backport", "c9s", issue)
	callers := func(from time.Time) map[string]int {
		n := map[string]int{}
		for _, c := range w.llm.Log() {
			if c.At.After(from) && c.Status == http.StatusOK {
				n[c.Agent]++
			}
		}
		return n
	}
	redistest.Eventually(t, 60*time.Second, func() bool { return len(callers(time.Time{})) == 3 },
		"the three agents call the LLM (triage log: %s)", workers["triage"].stderr())

	// Steady: the three share 5/s.
	steady := time.Now()
	sleepUntil(steady.Add(3 * time.Second))
	// In turn: each of the three had about a third of the 15 permits (the permits are
	// booked in the order asked, so none is passed over for being a little slower).
	steadyCalls := callers(steady)
	// One is SIGKILLed mid-way: the two others go on.
	killed := time.Now()
	if err := workers["rebase"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	workers["rebase"].exit(10 * time.Second)
	sleepUntil(killed.Add(2500 * time.Millisecond))
	after := callers(killed.Add(100 * time.Millisecond))
	for _, agent := range []string{"triage", "rebase", "backport"} {
		if steadyCalls[agent] < 3 {
			t.Errorf("calls in the steady 3 s: %v, want each agent about 5 (in turn)", steadyCalls)
			break
		}
	}
	if after["triage"] == 0 || after["backport"] == 0 || after["rebase"] != 0 {
		t.Errorf("calls after the SIGKILL of rebase's worker: %v, want triage and backport going on", after)
	}

	// A 429 with Retry-After 2 s: the agent that meets it reports it; everyone pauses.
	w.llm.FailNext(1, 2)
	var at429 time.Time
	redistest.Eventually(t, 10*time.Second, func() bool {
		for _, c := range w.llm.Log() {
			if c.Status == http.StatusTooManyRequests {
				at429 = c.At
				return true
			}
		}
		return false
	}, "an agent meets the 429")
	sleepUntil(at429.Add(5 * time.Second))
	log := w.llm.Log()
	for _, wk := range []*proc{workers["triage"], workers["backport"]} {
		if code, _ := wk.stop(20 * time.Second); code != 0 {
			t.Errorf("worker exit %d: %s", code, wk.stderr())
		}
	}

	calls := okCalls(log)
	checkWindows(t, calls, steady, at429, permitRate+permitBurst)
	// The pause: nothing from anyone between the report (a call granted just before it
	// may still go out) and the end of the Retry-After.
	for _, c := range calls {
		if c.At.After(at429.Add(300*time.Millisecond)) && c.At.Before(at429.Add(1900*time.Millisecond)) {
			t.Errorf("%s called %s after the 429, within its Retry-After of 2 s", c.Agent, c.At.Sub(at429))
		}
	}
	// Then half the rate (2.5/s) for a minute: at most 3 in any second.
	checkWindows(t, calls, at429.Add(2*time.Second), at429.Add(5*time.Second), (permitRate+1)/2+permitBurst)
	var before, halved int
	for _, c := range calls {
		switch {
		case c.At.After(steady) && c.At.Before(steady.Add(3*time.Second)):
			before++
		case c.At.After(at429.Add(2 * time.Second)):
			halved++
		}
	}
	t.Logf("FIGURE permits llm:x=5/s, 3 worker processes: %d calls in 3 s before the 429 (%d in all); %d in the 3 s after its 2 s pause (half the rate)",
		before, len(calls), halved)
	if before < 8 || halved > 3*permitRate/2+permitBurst+1 {
		t.Errorf("%d calls in the steady 3 s (want about 15), %d in the 3 s at half the rate (want at most 9)", before, halved)
	}
}

func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

func okCalls(log []fakellm.Call) []fakellm.Call {
	out := slices.DeleteFunc(slices.Clone(log), func(c fakellm.Call) bool { return c.Status != http.StatusOK })
	slices.SortFunc(out, func(a, b fakellm.Call) int { return a.At.Compare(b.At) })
	return out
}

// checkWindows fails the test when more than most calls started within a second of
// each other, among those between from and to.
func checkWindows(t *testing.T, calls []fakellm.Call, from, to time.Time, most int) {
	t.Helper()
	for i, c := range calls {
		if c.At.Before(from) || c.At.After(to) {
			continue
		}
		n := 0
		for _, d := range calls[i:] {
			if d.At.Sub(c.At) >= time.Second || d.At.After(to) {
				break
			}
			n++
		}
		if n > most {
			t.Errorf("%d calls in the second from %s, want at most %d (the limit plus the burst)", n, c.At.Format("15:04:05.000"), most)
			return
		}
	}
}
