package integration

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/drainreq"
	"github.com/ymirflow/ymirflow/internal/presence"
)

// drainCLI runs `ymirflow drain ARGS` on the scenario's Redis and returns its output.
func (s *scenario) drainCLI(args ...string) string {
	s.t.Helper()
	cmd := exec.Command(binary, append([]string{"drain", "--redis-url", s.url, "--log-level", "warn"}, args...)...)
	cmd.Env = append(s.baseEnv(), "YMIR_OPERATOR=integration")
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("ymirflow drain %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// drainStates is the drain state of each live subscription of worker name (its
// presence records), by consumer.
func (s *scenario) drainStates(name string) map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return nil
	}
	out := map[string]string{}
	zs, _ := s.rdb.ZRangeWithScores(ctx, topo.Workers(), 0, -1).Result()
	for _, z := range zs {
		b, ok := presence.Decode(z.Member.(string))
		if ok && strings.HasPrefix(b.Consumer, name+"-") && time.UnixMilli(int64(z.Score)).After(now) {
			out[b.Consumer] = b.Drain
		}
	}
	return out
}

// allIn reports whether every state of m is want (and m has some).
func allIn(m map[string]string, want string) bool {
	for _, st := range m {
		if st != want {
			return false
		}
	}
	return len(m) > 0
}

// triageSettled reports whether every triage request has its one outcome and nothing
// is pending in the triage group (downstream requests are left unread: no worker).
func (s *scenario) triageSettled() (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.snapshot(ctx)
	if err != nil {
		return false, err.Error()
	}
	for _, e := range st.entries {
		if e.route.Agent == "triage" && len(st.resultsOf[e.key()]) == 0 && len(st.deadOf[e.key()]) == 0 {
			return false, "no outcome yet for " + e.stream + " " + e.id + " (" + e.issue + ")"
		}
	}
	for _, r := range topo.Inputs("triage", "") {
		if n := st.pending[r.Stream+" "+r.Group]; n > 0 {
			return false, "entries pending in " + r.Stream
		}
	}
	return true, ""
}

func (s *scenario) waitTriageSettled(within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := s.triageSettled()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("triage not settled within %s: %s", within, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDrainOneWorkerUnderLoad: two triage workers under a stream of issues; one is
// drained with `ymirflow drain --worker NAME --wait`: it finishes the run it has (no
// run of it ends by a SIGTERM), starts none after it reports drained, and the other
// keeps consuming, its read-ahead included. SIGKILLed and restarted while the request
// stands, it starts drained. Undrained (`drain --undo`), it runs events again. Every
// triage request has exactly one outcome and one run: nothing lost, nothing twice.
func TestDrainOneWorkerUnderLoad(t *testing.T) {
	o := defaultOptions()
	o.triage, o.perGroup, o.fetcher, o.noFail = 2, 0, false, true
	o.runnerMin, o.runnerMax = 100, 300
	s := newScenario(t, o)
	a := s.startWorker(group{agent: "triage"}, "triage-a")
	b := s.startWorker(group{agent: "triage"}, "triage-b")
	s.addIssues(24)
	// Under load: both run.
	deadline := time.Now().Add(15 * time.Second)
	for s.ranOn(a.pid) == 0 || s.ranOn(b.pid) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("both workers did not run within 15s (a %d, b %d)", s.ranOn(a.pid), s.ranOn(b.pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	out := s.drainCLI("--worker", "triage-a", "--reason", "upgrade", "--wait", "--timeout", "15s")
	drained := time.Now()
	if !strings.Contains(out, "1/1 drained") && !strings.Contains(out, "2/2 drained") {
		t.Fatalf("drain --wait:\n%s", out)
	}
	t.Logf("drain --wait:\n%s", out)
	t.Logf("FIGURE drain: worker drained in %s (runner 100-300 ms, BLOCK_TIME %s)", drained.Sub(start).Round(time.Millisecond), o.tm.Block)
	if st := s.drainStates("triage-a"); !allIn(st, drainreq.Drained) {
		t.Fatalf("triage-a's presence says %v, want drained", st)
	}
	// The other keeps consuming, while a's count stays.
	aRuns := s.ranOn(a.pid)
	s.addIssues(10)
	s.waitTriageSettled(20 * time.Second)
	if n := s.ranOn(a.pid); n != aRuns {
		t.Fatalf("the drained worker started %d runs", n-aRuns)
	}
	// SIGKILLed and restarted under the standing request: it starts drained.
	s.kill(a)
	a = s.startWorker(group{agent: "triage"}, "triage-a")
	deadline = time.Now().Add(10 * time.Second)
	for !allIn(s.drainStates("triage-a"), drainreq.Drained) {
		if time.Now().After(deadline) {
			t.Fatalf("restarted triage-a is %v, want drained", s.drainStates("triage-a"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.addIssues(6)
	s.waitTriageSettled(20 * time.Second)
	if n := s.ranOn(a.pid); n != 0 {
		t.Fatalf("the worker restarted drained ran %d events", n)
	}
	// Undrained, it takes work again.
	s.drainCLI("--worker", "triage-a", "--undo", "--reason", "upgrade done")
	s.addIssues(12)
	deadline = time.Now().Add(15 * time.Second)
	for s.ranOn(a.pid) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("undrained triage-a ran nothing within 15s; presence %v", s.drainStates("triage-a"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.waitTriageSettled(20 * time.Second)
	s.checkTriageOnce(drained)
}

// ranOn counts the triage runs the worker of pid started.
func (s *scenario) ranOn(pid int) int {
	runs, _ := s.runs()
	n := 0
	for _, r := range runs {
		if r.workerPID == pid {
			n++
		}
	}
	return n
}

// checkTriageOnce: every triage request ran once, ended ok (none stopped by its
// worker: a drain lets the run finish), and has one outcome record.
func (s *scenario) checkTriageOnce(drained time.Time) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.snapshot(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	runs, bad := s.runs()
	for _, b := range bad {
		s.t.Error(b)
	}
	byMsg := map[string][]run{}
	for _, r := range runs {
		if r.agent == "triage" {
			byMsg[r.msgID] = append(byMsg[r.msgID], r)
		}
	}
	n := 0
	for _, e := range st.entries {
		if e.route.Agent != "triage" {
			continue
		}
		n++
		if rs := byMsg[e.id]; len(rs) != 1 || rs[0].how != "ok" {
			s.t.Errorf("triage entry %s (%s): runs %v, want one that ended ok", e.id, e.issue, rs)
		}
		if recs := st.resultsOf[e.key()]; len(recs) != 1 {
			s.t.Errorf("triage entry %s (%s): %d outcome records, want 1", e.id, e.issue, len(recs))
		}
	}
	s.t.Logf("%d triage requests, each run once; drained at %s", n, drained.Format("15:04:05.000"))
}
