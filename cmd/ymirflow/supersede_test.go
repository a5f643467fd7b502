package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// supersedeAgent is an exec agent that notes each run in runs.log ("start|term|exit
// <worker> <fence> <entry> <unix ns>"), works 20 s on its first run and 200 ms on the
// others, and answers triage with
// AGENT_RESOLUTION. On SIGTERM it still tries to finish, 300 ms later, with its answer:
// a late write, which must not reach Jira.
const supersedeAgent = `#!/bin/sh
log="$AGENT_WORKDIR/runs.log"
note() { echo "$1 $AGENT_WORKER $YMIR_FENCE $YMIR_MESSAGE_ID $(date +%s%N)" >> "$log"; }
answer() { echo '{"resolution":"'"$AGENT_RESOLUTION"'","data":{"fence":"'"$YMIR_FENCE"'"}}'; }
trap 'note term; sleep 0.3; answer; note exit; exit 0' TERM
note start
ms=200
if mkdir "$AGENT_WORKDIR/first-run" 2>/dev/null; then ms=20000; fi
i=0
while [ $i -lt $((ms / 50)) ]; do sleep 0.05; i=$((i + 1)); done
answer
note exit
`

type agentRun struct {
	worker, entry     string
	fence             int64
	start, term, exit time.Time
}

// readRuns parses runs.log by entry id.
func readRuns(t *testing.T, path string) map[string]*agentRun {
	t.Helper()
	b, _ := os.ReadFile(path)
	runs := map[string]*agentRun{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 5 {
			continue
		}
		r := runs[f[3]]
		if r == nil {
			r = &agentRun{worker: f[1], entry: f[3]}
			r.fence, _ = strconv.ParseInt(f[2], 10, 64)
			runs[f[3]] = r
		}
		ns, _ := strconv.ParseInt(f[4], 10, 64)
		at := time.Unix(0, ns)
		switch f[0] {
		case "start":
			r.start = at
		case "term":
			r.term = at
		case "exit":
			r.exit = at
		}
	}
	return runs
}

// Issue 23, supersede across processes: a worker process runs an exec agent on an
// issue; a newer event for the issue is handled by a worker in another process, which
// takes the lease over. The first worker's agent gets SIGTERM within KILL_GRACE plus one
// heartbeat of the newer event (the announcement makes it far sooner), its late answer
// never reaches Jira (the old run's labels are refused with its lease), its event is
// recorded once as lock.superseded naming the newer entry, and the newer event runs
// once, with a higher fence, starting only after the old agent has exited.
func TestSupersedeAcrossWorkerProcesses(t *testing.T) {
	// Not parallel: it runs its own processes and times a cancel.
	bin := buildBinary(t)
	admin, ns := redistest.Client(t)
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(script, []byte(supersedeAgent), 0o755); err != nil {
		t.Fatal(err)
	}
	const issue = "RHEL-904"
	srv := fakejira.New(fakejira.Options{Token: "kit-token", Issues: []fakejira.Issue{{Key: issue, Summary: "s"}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	const ttl, grace = 9 * time.Second, 800 * time.Millisecond
	resolution := map[string]string{"w1": "postponed", "w2": "not-affected"}
	label := map[string]string{"w1": labels.TriagedPostponed, "w2": labels.TriagedNotAffected}
	worker := func(name string) *proc {
		return startProc(t, bin, []string{"REDIS_URL=" + redistest.URL(), "AGENT_WORKDIR=" + dir,
			"AGENT_WORKER=" + name, "AGENT_RESOLUTION=" + resolution[name]},
			"worker", "--agent", "triage", "--runner", "exec", "--exec", "sh "+script, "--runner-env", "AGENT_*",
			"--ymir-namespace", topo.Namespace, "--metrics-addr", "", "--on-conflict", "supersede",
			"--lock-ttl", ttl.String(), "--max-idle-time", "6s", "--claim-interval", "500ms", "--kill-grace", grace.String(),
			"--jira-url", ts.URL, "--jira-token", "kit-token", "--jira-rate-limit", "-1", "--block-time", "200ms",
			"--consumer-name", name)
	}
	// Each worker is up once its routers' presence is in Redis (one member per
	// subscription: the main stream and its :todo twin).
	present := func() int64 { return admin.ZCard(context.Background(), topo.Workers()).Val() }
	w1 := worker("w1")
	redistest.Eventually(t, 30*time.Second, func() bool { return present() >= 2 }, "w1 runs")
	w2 := worker("w2")
	redistest.Eventually(t, 30*time.Second, func() bool { return present() >= 4 }, "w2 runs")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("w1:\n%s\nw2:\n%s", w1.stderr(), w2.stderr())
		}
	})
	main := topo.Stream("triage", "", false)

	first := publishFollowup(t, admin, topo, issue, "", "", "")
	log := filepath.Join(dir, "runs.log")
	redistest.Eventually(t, 30*time.Second, func() bool { return readRuns(t, log)[first] != nil }, "the first event's agent runs")
	// The newer event must reach the other process: one read ahead by the holder's own
	// subscription would wait for its run (and, older than the event that does reach
	// the other process, be recorded as superseded then). Published again until one
	// lands elsewhere; Redis hands a new entry to the reader that has waited longest,
	// the other worker's, so this takes one event but for a rare race.
	holder := pendingConsumer(admin, main, first)
	var sent time.Time
	var second string
	var extra []string
	for range 4 {
		sent = time.Now()
		second = publishFollowup(t, admin, topo, issue, "", "", "")
		var at string
		redistest.Eventually(t, 10*time.Second, func() bool { at = pendingConsumer(admin, main, second); return at != "" }, "event %s read", second)
		if at != holder {
			break
		}
		extra = append(extra, second)
	}
	redistest.Eventually(t, 30*time.Second, func() bool {
		r := readRuns(t, log)
		return r[first].exit != (time.Time{}) && r[second] != nil && r[second].exit != (time.Time{})
	}, "the old agent stopped and the newer event's agent ran")
	runs := readRuns(t, log)
	old, newer := runs[first], runs[second]
	if old.worker == newer.worker {
		t.Fatalf("both events ran in %s: the newer one must be handled by another process", old.worker)
	}
	bound := grace + ttl/3
	stopped := old.exit.Sub(sent)
	t.Logf("FIGURE supersede across processes: old agent SIGTERMed %s and exited %s after the newer event was published (bound KILL_GRACE + LOCK_TTL/3 = %s); newer agent started %s after the old one exited; %d newer events reached the holder first",
		old.term.Sub(sent).Round(time.Millisecond), stopped.Round(time.Millisecond), bound, newer.start.Sub(old.exit).Round(time.Millisecond), len(extra))
	if old.term.IsZero() || stopped > bound {
		t.Errorf("the old agent stopped %s after the newer event (SIGTERM at %v), want within %s", stopped, old.term, bound)
	}
	if newer.start.Before(old.exit) {
		t.Errorf("the newer agent started %s before the old one exited: the runs overlap", old.exit.Sub(newer.start))
	}
	if newer.fence <= old.fence {
		t.Errorf("newer fence %d, old %d: want higher", newer.fence, old.fence)
	}
	redistest.Eventually(t, 20*time.Second, func() bool {
		return len(records(context.Background(), admin, topo, event.StageDone, issue)) == 1 &&
			len(records(context.Background(), admin, topo, event.LockSuperseded, issue)) == 1+len(extra)
	}, "one outcome and one superseded record per older event")
	var sup map[string]any
	for _, m := range records(context.Background(), admin, topo, event.LockSuperseded, issue) {
		if m.Values["message_id"] == first {
			sup = m.Values
		}
	}
	// An event published again because it reached the holder (extra) ends the first run
	// there already (its subscription sees a newer event wait behind the run) unless
	// the other process's take-over comes first: either newer event may be named.
	if by := sup["holder_message_id"]; (by != second && !slices.Contains(extra, fmt.Sprint(by))) || sup["cancelled"] != "true" || sup["ran"] != "true" {
		t.Errorf("lock.superseded %v, want %s superseded by %s (or one of %v, published first), cancelled", sup, first, second, extra)
	}
	if done := records(context.Background(), admin, topo, event.StageDone, issue)[0].Values; done["message_id"] != second {
		t.Errorf("the outcome is %v's, want the newer event's %s", done["message_id"], second)
	}
	// Jira holds the newer run's answer; the old run's late answer never reached it.
	got := srv.Labels(issue)
	if !slices.Contains(got, label[newer.worker]) || slices.Contains(got, label[old.worker]) {
		t.Errorf("Jira labels %v: want %s (the newer run's) and not %s (the superseded run's late answer)", got, label[newer.worker], label[old.worker])
	}
	for _, p := range []*proc{w1, w2} {
		if code, _ := p.stop(20 * time.Second); code != 0 {
			t.Errorf("worker exit %d", code)
		}
	}
	if n := len(records(context.Background(), admin, topo, event.StageDone, issue)); n != 1 {
		t.Errorf("%d outcomes after the workers stopped, want 1", n)
	}
}

// pendingConsumer is the consumer of the triage group that entry id of stream is
// pending for, "" if none.
func pendingConsumer(rdb *redis.Client, stream, id string) string {
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "triage",
		Start: id, End: id, Count: 1}).Result()
	if err != nil || len(p) == 0 {
		return ""
	}
	return p[0].Consumer
}
