package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// publishFollowup publishes a triage request for issue carrying a maintainer's comment
// (the metadata a webhook's comment.created event carries) and returns its stream id.
//
// A follow-up meets the lease only when another subscription reads it while the run
// goes on: the run's own subscription reads ahead, and an entry waiting there runs
// after the run instead (docs/architecture.md, "Comments as follow-ups"). So the run here comes from the main
// stream and the comment from the :todo twin, as a maintainer's request does.
func publishFollowup(t *testing.T, rdb *redis.Client, topo event.Topology, issue, author, body, commentID string) string {
	t.Helper()
	todo := author != ""
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + issue + `"}}`))
	task.UserTriggered = todo
	msg, err := event.New(event.TriageRequested, issue, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg.Metadata.Set(event.MetaCommentAuthor, author)
	msg.Metadata.Set(event.MetaCommentBody, body)
	msg.Metadata.Set(event.MetaCommentID, commentID)
	id, err := event.NewPublisher(rdb, 0).PublishID(context.Background(), topo.Stream("triage", "", todo), msg)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// records returns the results of eventType for issue.
func records(ctx context.Context, rdb *redis.Client, topo event.Topology, eventType, issue string) []redis.XMessage {
	all, _ := rdb.XRange(ctx, topo.Results(), "-", "+").Result()
	var out []redis.XMessage
	for _, m := range all {
		if m.Values["event_type"] == eventType && m.Values["issue_key"] == issue {
			out = append(out, m)
		}
	}
	return out
}

// Issue 24 items 2 and 4: under ON_CONFLICT=deliver, a maintainer's comment published
// while an example agent runs reaches its YMIR_MAILBOX within a second; acknowledged,
// it is recorded as delivered and starts nothing; not acknowledged, it starts exactly
// one next run, which gets it in its Task JSON.
func TestDeliverFollowupToRunningAgent(t *testing.T) {
	agents := kitAgents(t)
	for _, a := range agents {
		for _, ack := range []bool{true, false} {
			name := a.name + "/acked"
			if !ack {
				name = a.name + "/not-acked"
			}
			t.Run(name, func(t *testing.T) {
				// Not parallel: the worker reads its settings from the environment (t.Setenv), and it times the delivery.
				admin, topo, dir := kitWorld(t, "5000")
				if !ack {
					t.Setenv("AGENT_NO_ACK", "1")
				}
				const issue = "RHEL-902"
				srv := fakejira.New(fakejira.Options{Token: "kit-token", Issues: []fakejira.Issue{{Key: issue, Summary: "s"}}})
				ts := httptest.NewServer(srv)
				t.Cleanup(ts.Close)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var out, errb testlog.Buffer
				t.Cleanup(func() {
					if t.Failed() {
						t.Logf("worker log:\n%s%s", out.String(), errb.String())
					}
				})
				done := make(chan int, 1)
				go func() {
					done <- run(ctx, []string{"worker", "--agent", "triage", "--runner", "exec", "--exec", a.command,
						"--runner-env", "AGENT_*", "--ymir-namespace", topo.Namespace, "--metrics-addr", "",
						"--on-conflict", "deliver", "--mailbox-depth", "10",
						"--jira-url", ts.URL, "--jira-token", "kit-token", "--jira-rate-limit", "-1", "--block-time", "200ms",
						"--consumer-name", "w1"}, &out, &errb)
				}()
				publishFollowup(t, admin, topo, issue, "", "", "")
				// The agent notes when it has opened YMIR_MAILBOX: it runs from then on.
				trace := filepath.Join(dir, "triage", "mailbox-"+issue+".log")
				var lines []string
				read := func() int {
					b, _ := os.ReadFile(trace)
					lines = strings.Split(strings.TrimSpace(string(b)), "\n")
					if len(b) == 0 {
						return 0
					}
					return len(lines)
				}
				redistest.Eventually(t, 20*time.Second, func() bool { return read() == 1 }, "the agent runs and reads its mailbox")

				sent := time.Now()
				publishFollowup(t, admin, topo, issue, "ann", "also update the tests", "10042")
				redistest.Eventually(t, 10*time.Second, func() bool { return read() == 2 }, "the follow-up reached the agent's mailbox")
				if took := time.Since(sent); took > time.Second {
					if load := loadAverage(); load > float64(4*runtime.NumCPU()) {
						t.Logf("the follow-up took %s to reach the agent, under a load average of %.1f on %d CPUs", took, load, runtime.NumCPU())
					} else {
						t.Errorf("the follow-up took %s to reach the agent, want under a second", took)
					}
				}
				var fu map[string]string
				if err := json.Unmarshal([]byte(lines[1]), &fu); err != nil || fu["id"] == "" {
					t.Fatalf("the agent's second mailbox line %q (%v) is not the follow-up: it reached no live run", lines[1], err)
				}
				if fu["author"] != "ann" || fu["body"] != "also update the tests" || fu["comment_id"] != "10042" || fu["id"] == "" {
					t.Errorf("mailbox line %v", fu)
				}
				runs := 1
				fate := event.FollowupDelivered
				if !ack {
					runs, fate = 2, event.FollowupRolled
				}
				redistest.Eventually(t, 30*time.Second, func() bool {
					return len(records(ctx, admin, topo, event.StageDone, issue)) == runs &&
						len(records(ctx, admin, topo, fate, issue)) == 1
				}, "%d run(s) and the follow-up %s", runs, fate)
				time.Sleep(500 * time.Millisecond) // a window for a wrong extra run to show
				cancel()
				select {
				case code := <-done:
					if code != 0 {
						t.Fatalf("worker exit %d", code)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("worker did not stop")
				}
				if n := len(records(context.Background(), admin, topo, event.StageDone, issue)); n != runs {
					t.Fatalf("%d runs, want %d", n, runs)
				}
				if n := len(records(context.Background(), admin, topo, event.LockDelivered, issue)); n != 1 {
					t.Errorf("%d lock.delivered records, want 1", n)
				}
				rec := records(context.Background(), admin, topo, fate, issue)[0]
				if rec.Values["outcome"] != fu["id"] || !strings.Contains(rec.Values["detail"].(string), `"followup_author":"ann"`) {
					t.Errorf("%s record %v, want the follow-up %s by ann", fate, rec.Values, fu["id"])
				}
				if !ack { // the next run got it in its Task JSON and says so in its data
					last := records(context.Background(), admin, topo, event.StageDone, issue)[1]
					if !strings.Contains(last.Values["detail"].(string), fu["id"]) {
						t.Errorf("the next run's outcome %v does not name the follow-up %s", last.Values["detail"], fu["id"])
					}
				}
				// The timeline shows the follow-up's arrival and its fate.
				var hout, herr testlog.Buffer
				if code := run(context.Background(), []string{"history", issue, "--ymir-namespace", topo.Namespace}, &hout, &herr); code != 0 {
					t.Fatalf("history: exit %d: %s", code, herr.String())
				}
				for _, want := range []string{event.LockDelivered, "delivered as follow-up " + fu["id"], fate} {
					if !strings.Contains(hout.String(), want) {
						t.Errorf("history lacks %q:\n%s", want, hout.String())
					}
				}
				if n := admin.Exists(context.Background(), "lockmail:"+topo.LockScope()+"triage:"+issue).Val(); n != 0 {
					t.Error("the mailbox outlived the runs that accounted for it")
				}
			})
		}
	}
}

// Issue 24 item 4: a worker SIGKILLed while its agent holds a delivered, unacknowledged
// follow-up loses it not: the re-run of the entry (another worker process, once the
// dead one's lease has expired) gets it in its Task JSON, and it is recorded as rolled
// into that run. One outcome for the issue.
func TestDeliverFollowupSurvivesSIGKILL(t *testing.T) {
	// Not parallel: it runs its own processes and times a lease's expiry.
	py := kitAgents(t)[0]
	bin := buildBinary(t)
	admin, ns := redistest.Client(t)
	topo := event.Topology{Namespace: strings.TrimSuffix(ns, ":")}
	dir := t.TempDir()
	const issue = "RHEL-903"
	srv := fakejira.New(fakejira.Options{Token: "kit-token", Issues: []fakejira.Issue{{Key: issue, Summary: "s"}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	worker := func(workMS string) *proc {
		return startProc(t, bin, []string{"REDIS_URL=" + redistest.URL(), "AGENT_WORKDIR=" + dir, "AGENT_WORK_MS=" + workMS,
			"AGENT_RESOLUTION=not-affected"},
			"worker", "--agent", "triage", "--runner", "exec", "--exec", py.command, "--runner-env", "AGENT_*",
			"--ymir-namespace", topo.Namespace, "--metrics-addr", "", "--on-conflict", "deliver",
			"--lock-ttl", "3s", "--max-idle-time", "2s", "--claim-interval", "500ms", "--kill-grace", "300ms",
			"--jira-url", ts.URL, "--jira-token", "kit-token", "--jira-rate-limit", "-1", "--block-time", "200ms",
			"--consumer-name", "w1")
	}
	a := worker("20000")
	publishFollowup(t, admin, topo, issue, "", "", "")
	trace := filepath.Join(dir, "triage", "mailbox-"+issue+".log")
	lines := func() []string {
		b, _ := os.ReadFile(trace)
		if len(b) == 0 {
			return nil
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	redistest.Eventually(t, 30*time.Second, func() bool { return len(lines()) == 1 }, "the agent runs and reads its mailbox")
	publishFollowup(t, admin, topo, issue, "ann", "also update the tests", "10043")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(lines()) == 2 }, "the follow-up reached the agent")
	var fu map[string]string
	if err := json.Unmarshal([]byte(lines()[1]), &fu); err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.exit(10 * time.Second)

	b := worker("200")
	redistest.Eventually(t, 30*time.Second, func() bool {
		return len(records(context.Background(), admin, topo, event.StageDone, issue)) == 1 &&
			len(records(context.Background(), admin, topo, event.FollowupRolled, issue)) == 1
	}, "the re-run ends with the follow-up rolled into it (worker log: %s)", b.stderr())
	if code, _ := b.stop(20 * time.Second); code != 0 {
		t.Fatalf("worker exit %d: %s", code, b.stderr())
	}
	done := records(context.Background(), admin, topo, event.StageDone, issue)
	if len(done) != 1 || !strings.Contains(done[0].Values["detail"].(string), fu["id"]) {
		t.Fatalf("outcomes %v: want one, naming the follow-up %s", done, fu["id"])
	}
	if rolled := records(context.Background(), admin, topo, event.FollowupRolled, issue); rolled[0].Values["outcome"] != fu["id"] {
		t.Fatalf("rolled %v, want %s", rolled[0].Values, fu["id"])
	}
	if n := admin.Exists(context.Background(), "lockmail:"+topo.LockScope()+"triage:"+issue).Val(); n != 0 {
		t.Error("the mailbox outlived the run that accounted for it")
	}
}

// loadAverage is the machine's 1-minute load average (0 when unknown): a timing bound
// that a starved machine cannot meet is reported, not failed, above 4 per CPU.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
