package handlers_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/runners"
)

// fences counts what the handler reports to its FenceObserver.
type fences struct {
	mu      sync.Mutex
	refused map[string]int
	raced   map[string]int
}

func (f *fences) FencedWriteRefused(agent, target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused[agent+"/"+target]++
}

func (f *fences) FencedWriteRaced(agent, target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.raced[agent+"/"+target]++
}

// fenceWorld is a triage handler under a real lease (lock middleware, long TTL so its
// heartbeat never notices a loss on its own during the test) and a peer locker that
// takes the issue over the way a second worker does once the first one's lease expired.
type fenceWorld struct {
	e      *env
	locker *lease.Locker
	peer   *lease.Locker
	logs   *testlog.Buffer
	fences *fences
}

func newFenceWorld(t *testing.T, issues ...fakejira.Issue) *fenceWorld {
	e := newEnv(t, issues...)
	w := &fenceWorld{e: e, logs: &testlog.Buffer{}, fences: &fences{refused: map[string]int{}, raced: map[string]int{}}}
	var err error
	if w.locker, err = lease.New(e.rdb, lease.Options{Scope: e.topo.LockScope(), TTL: time.Minute, Owner: "paused"}); err != nil {
		t.Fatal(err)
	}
	if w.peer, err = lease.New(e.rdb, lease.Options{Scope: e.topo.LockScope(), TTL: time.Minute, Owner: "peer"}); err != nil {
		t.Fatal(err)
	}
	return w
}

// handle runs msg through the lock middleware and h, as the pipeline does.
func (w *fenceWorld) handle(t *testing.T, agent string, h message.NoPublishHandlerFunc, msg *message.Message) error {
	t.Helper()
	mw, err := lockmw.NewMiddleware(lockmw.Config{Locker: w.locker, Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	msg.Metadata.Set(event.MetaAttempt, "1")
	_, err = mw.Handler(func(m *message.Message) ([]*message.Message, error) { return nil, h(m) })(msg)
	return err
}

func (w *fenceWorld) config(c *handlers.Config) {
	c.Logger = zerolog.New(w.logs)
	c.Fences = w.fences
}

// expire ends the paused holder's lease the way a pause past the TTL does (the key
// expires; the holder's process does not run, so nothing of it notices), then the
// peer takes the issue under a higher fence.
func (w *fenceWorld) expireAndTakeOver(t *testing.T, agent, key string) *lease.Lease {
	t.Helper()
	ctx := context.Background()
	lk := w.locker.LockKey(agent, key)
	if err := w.e.rdb.PExpire(ctx, lk, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return w.e.rdb.Exists(ctx, lk).Val() == 0 }, "the lease expires")
	le, err := w.peer.Acquire(ctx, agent, key, lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return le
}

// peerRun is what the newer holder did to RHEL-40 while the first one was paused:
// triaged it as a backport, then the backport finished (both recorded, labels written).
func (w *fenceWorld) peerRun(t *testing.T, le *lease.Lease, key string) {
	t.Helper()
	ctx := context.Background()
	for _, rec := range []event.Record{
		{EventType: event.StageDone, Agent: "triage", IssueKey: key, Outcome: "backport", Fence: "2"},
		{EventType: event.StageDone, Agent: "backport", IssueKey: key, Outcome: labels.Backported, Fence: "1"},
	} {
		if _, err := w.e.results.Add(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.e.jc.UpdateLabels(ctx, key, []string{labels.Backported},
		[]string{labels.TriageInProgress, labels.TriagedBackport}); err != nil {
		t.Fatal(err)
	}
	if _, err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A holder paused past its lease TTL wakes up with its runner's result and goes on to
// write the resolution label: the write is refused before it reaches Jira, so the newer
// holder's labels stay; it is logged with fence and issue and counted; nothing is
// recorded or published under the old fence.
func TestPausedHolderJiraWriteIsRefused(t *testing.T) {
	t.Parallel()
	w := newFenceWorld(t, fakejira.Issue{Key: "RHEL-40"})
	e := w.e
	runner := &fixed{res: triageResult("backport", "c9s")}
	h := e.handler("triage", "", runner, w.config)
	var oldFence int64
	writesBefore := -1
	runner.during = func(ctx context.Context, req runners.RunRequest) {
		oldFence = req.Fence
		w.peerRun(t, w.expireAndTakeOver(t, "triage", req.IssueKey), req.IssueKey)
		writesBefore = len(e.fj.Writes())
	}
	err := w.handle(t, "triage", h, triageMsg(t, "RHEL-40", false, ""))
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	e.wantLabels("RHEL-40", labels.Backported)
	if n := len(e.fj.Writes()); n != writesBefore {
		t.Fatalf("%d Jira writes reached the server after the lease was lost: %+v", n-writesBefore, e.fj.Writes()[writesBefore:])
	}
	lines := w.logs.Messages("fenced write refused")
	if len(lines) != 1 || !strings.Contains(lines[0], `"issue_key":"RHEL-40"`) ||
		!strings.Contains(lines[0], `"fence":`+itoa64(oldFence)) || !strings.Contains(lines[0], `"target":"labels"`) {
		t.Fatalf("'fenced write refused' lines = %q, want one with issue_key RHEL-40 and fence %d", lines, oldFence)
	}
	if w.fences.refused["triage/labels"] != 1 {
		t.Fatalf("refused writes counted: %v", w.fences.refused)
	}
	for _, r := range e.recordsOf("RHEL-40", "triage") {
		if r["fence"] == itoa64(oldFence) {
			t.Fatalf("the paused holder recorded an outcome: %v", r)
		}
	}
	if s := e.streamsWithEntries(); len(s) != 0 {
		t.Fatalf("the paused holder published: %v", s)
	}
}

// A comment is fenced the same way. Here the paused holder's lease expires while it
// reads a Closed issue that a maintainer asked to triage: it has no label to change, so
// its first write is the "already closed" comment, which is refused (comments are best
// effort: logged and counted), and its skip record is refused too.
func TestPausedHolderJiraCommentIsRefused(t *testing.T) {
	t.Parallel()
	w := newFenceWorld(t, fakejira.Issue{Key: "RHEL-41", Status: "Closed"})
	e := w.e
	h := e.handler("triage", "", &fixed{res: triageResult("postponed", "")}, w.config,
		func(c *handlers.Config) {
			c.Jira = hookJira{JiraAPI: e.jc, beforeGet: func() { w.expireAndTakeOver(t, "triage", "RHEL-41") }}
		})
	err := w.handle(t, "triage", h, triageMsg(t, "RHEL-41", true, ""))
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	if c := e.fj.Comments("RHEL-41"); len(c) != 0 {
		t.Fatalf("comments %v", c)
	}
	if w.fences.refused["triage/comment"] != 1 {
		t.Fatalf("refused writes counted: %v", w.fences.refused)
	}
	// one line for the comment, one for the record
	lines := w.logs.Messages("fenced write refused")
	if len(lines) != 2 || !strings.Contains(lines[0], `"target":"comment"`) || !strings.Contains(lines[1], "record stage.done") {
		t.Fatalf("'fenced write refused' lines: %q", lines)
	}
	if r := e.records(""); len(r) != 0 {
		t.Fatalf("records %v", r)
	}
}

// hookJira runs hooks around the calls of a real Jira client.
type hookJira struct {
	handlers.JiraAPI
	beforeGet    func()
	beforeUpdate func(add []string)
}

func (j hookJira) GetIssue(ctx context.Context, key string, fields []string) (jira.Issue, error) {
	if j.beforeGet != nil {
		j.beforeGet()
	}
	return j.JiraAPI.GetIssue(ctx, key, fields)
}

func (j hookJira) UpdateLabels(ctx context.Context, key string, add, remove []string) error {
	if j.beforeUpdate != nil {
		j.beforeUpdate(add)
	}
	return j.JiraAPI.UpdateLabels(ctx, key, add, remove)
}

// The window a fence check leaves: the holder proves its lease, then pauses past the
// TTL before its write is sent; meanwhile a newer holder triages and the backport
// finishes. The late write lands on the newer state, but the holder proves its lease
// again after Jira answered, finds it lost, and converges the labels to the last
// recorded outcome (the backport's), so the stale label does not survive.
func TestRacedLabelWriteConverges(t *testing.T) {
	t.Parallel()
	w := newFenceWorld(t, fakejira.Issue{Key: "RHEL-42"})
	e := w.e
	var once sync.Once
	h := e.handler("triage", "", &fixed{res: triageResult("backport", "c9s")}, w.config,
		func(c *handlers.Config) {
			c.Jira = hookJira{JiraAPI: e.jc, beforeUpdate: func(add []string) {
				if !slices.Contains(add, labels.TriagedBackport) {
					return
				}
				once.Do(func() { w.peerRun(t, w.expireAndTakeOver(t, "triage", "RHEL-42"), "RHEL-42") })
			}}
		})
	err := w.handle(t, "triage", h, triageMsg(t, "RHEL-42", false, ""))
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	e.wantLabels("RHEL-42", labels.Backported)
	if w.fences.raced["triage/labels"] != 1 {
		t.Fatalf("raced writes counted: %v", w.fences.raced)
	}
	if len(w.logs.Messages("fenced write raced")) != 1 || len(w.logs.Messages("labels converged")) != 1 {
		t.Fatalf("want one 'fenced write raced' and one 'labels converged' line, got %q %q",
			w.logs.Messages("fenced write raced"), w.logs.Messages("labels converged"))
	}
	if s := e.streamsWithEntries(); len(s) != 0 {
		t.Fatalf("the raced holder published: %v", s)
	}
}

// Every terminal label write asserts the issue's whole state, so a label a stale holder
// left (here a late claim and a late resolution label) does not survive the next write
// of the newer holder; the triggers and other tools' labels are left alone.
func TestTerminalWriteErasesStaleStateLabels(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fakejira.Issue{Key: "RHEL-43", Labels: []string{labels.TriageInProgress,
		labels.TriagedRebase, labels.TriagedBackport, "keep", labels.Todo}})
	h := e.handler("backport", "c9s", &fixed{res: runners.Result{Success: true}})
	if err := attempt(h, downstreamMsg(t, "backport", "RHEL-43", "c9s", false), 1); err != nil {
		t.Fatal(err)
	}
	e.wantLabels("RHEL-43", labels.Backported, "keep", labels.Todo)
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

// Converging checks for a live holder again just before its write: a run that claims
// the issue while converge reads the outcomes and the issue keeps its claim label (here
// a new triage run's ymir_triage_in_progress), which the write would have removed.
func TestConvergeLeavesARunThatStartedMeanwhile(t *testing.T) {
	t.Parallel()
	w := newFenceWorld(t, fakejira.Issue{Key: "RHEL-44"})
	e := w.e
	var raced, claimed atomic.Bool
	var once sync.Once
	h := e.handler("triage", "", &fixed{res: triageResult("backport", "c9s")}, w.config,
		func(c *handlers.Config) {
			c.Jira = hookJira{JiraAPI: e.jc,
				beforeUpdate: func(add []string) {
					if slices.Contains(add, labels.TriagedBackport) {
						once.Do(func() {
							w.peerRun(t, w.expireAndTakeOver(t, "triage", "RHEL-44"), "RHEL-44")
							raced.Store(true)
						})
					}
				},
				beforeGet: func() {
					// converge's read of the issue: a new triage run claims it now.
					if raced.Load() && claimed.CompareAndSwap(false, true) {
						if _, err := w.peer.Acquire(context.Background(), "triage", "RHEL-44", lease.AcquireOptions{}); err != nil {
							t.Error(err)
						}
						if err := e.jc.UpdateLabels(context.Background(), "RHEL-44", []string{labels.TriageInProgress}, nil); err != nil {
							t.Error(err)
						}
					}
				}}
		})
	err := w.handle(t, "triage", h, triageMsg(t, "RHEL-44", false, ""))
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	if !claimed.Load() {
		t.Fatal("converge never read the issue: the race was not set up")
	}
	is, err := e.jc.GetIssue(context.Background(), "RHEL-44", []string{"labels"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(is.Fields.Labels, labels.TriageInProgress) {
		t.Fatalf("converge removed the new run's claim: labels %v", is.Fields.Labels)
	}
	if len(w.logs.Messages("labels not converged: a run of the issue started meanwhile")) != 1 {
		t.Fatalf("want one 'a run of the issue started meanwhile' line: %q", w.logs.Messages("converge"))
	}
}
