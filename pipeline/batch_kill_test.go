package pipeline_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// Quick runs end in batches (lockmw/batch.go): a worker process SIGKILLed while its
// runs' ends wait for their batch leaves those entries pending and their leases to
// expire. Under repeated kills of real processes: no two runs of one issue overlap,
// and every event either ran or has its conflict record; nothing stays pending.
func TestQuickRunsUnderSIGKILL(t *testing.T) {
	// Not parallel: it runs worker processes and kills them.
	e := newEnv(t)
	spec := func(c string) workerSpec {
		return workerSpec{ns: e.ns, consumer: c, ttl: time.Second, maxIdle: 600 * time.Millisecond,
			block: 100 * time.Millisecond, hold: 20 * time.Microsecond, claimInterval: 100 * time.Millisecond}
	}
	startWorker(t, spec("b"))
	ctx := context.Background()
	ledger := e.ns + "ledger"
	const events, issues = 300, 20
	for round := range 3 {
		a, _ := startWorker(t, spec("a"+strconv.Itoa(round)))
		before := len(ledgerLines(e, "start"))
		for i := range events / 3 {
			e.publishTriage(fmt.Sprintf("RHEL-%d", i%issues+1))
		}
		// Killed in the middle of its burst: quick runs, some ends waiting. A burst
		// handled whole already (most of it dropped as locked behind runs of the same
		// issues: 29 runs once, under load) has no middle left; the kill lands after it.
		redistest.Eventually(t, 20*time.Second, func() bool {
			return len(ledgerLines(e, "start")) >= before+30 || e.allHandled()
		}, "runs under way, or every entry handled")
		_ = a.Process.Signal(syscall.SIGKILL)
		_ = a.Wait()
		e.rdb.RPush(ctx, ledger, "kill "+strconv.Itoa(a.Process.Pid))
	}
	redistest.Eventually(t, 60*time.Second, func() bool { return e.pending(e.triage()) == 0 && len(e.triageEntries()) == events }, "every entry acked")
	checkExclusiveRuns(t, e.rdb.LRange(ctx, ledger, 0, -1).Val())
	ran := map[string]bool{}
	for _, l := range ledgerLines(e, "start") {
		if f := strings.Fields(l); len(f) >= 7 {
			ran[f[6]] = true
		}
	}
	recorded := map[string]bool{}
	for _, m := range e.results(event.LockDropped) {
		recorded[fmt.Sprint(m.Values["message_id"])] = true
	}
	for _, id := range e.triageEntries() {
		if !ran[id] && !recorded[id] {
			t.Errorf("entry %s neither ran nor was recorded as dropped", id)
		}
	}
	t.Logf("%d events, %d runs (%d entries ran), %d dropped records", events, len(ledgerLines(e, "start")), len(ran), len(recorded))
}

// checkExclusiveRuns reads a ledger of "start ISSUE CONSUMER PID ...", "end ISSUE
// CONSUMER PID" and "kill PID" lines in the order Redis appended them: a run starts only
// once the issue's previous run has ended or its process was killed.
func checkExclusiveRuns(t *testing.T, lines []string) {
	t.Helper()
	open := map[string]string{} // issue → pid of its run under way
	killed := map[string]bool{}
	for i, l := range lines {
		f := strings.Fields(l)
		switch {
		case f[0] == "kill":
			killed[f[1]] = true
		case f[0] == "start":
			if pid, ok := open[f[1]]; ok && !killed[pid] {
				t.Errorf("ledger line %d: %s starts while the run of process %s is under way", i, f[1], pid)
			}
			open[f[1]] = f[3]
		case f[0] == "end" && open[f[1]] == f[3]:
			delete(open, f[1])
		}
	}
}

// triageEntries are the ids of the triage stream's entries.
func (e *env) triageEntries() []string {
	var ids []string
	for _, m := range e.rdb.XRange(context.Background(), e.triage(), "-", "+").Val() {
		ids = append(ids, m.ID)
	}
	return ids
}

// allHandled reports whether the triage group has read every entry of its stream and
// holds none pending.
func (e *env) allHandled() bool {
	groups, err := e.rdb.XInfoGroups(context.Background(), e.triage()).Result()
	if err != nil {
		return false
	}
	for _, g := range groups {
		if g.Name == "triage" {
			return g.Pending == 0 && g.Lag == 0
		}
	}
	return false
}
