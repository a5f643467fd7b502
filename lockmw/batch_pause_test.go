package lockmw_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// pauseReads matches Pauses.Check's read of the registry reg: one pause check.
func pauseReads(reg string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		args := cmd.Args()
		return cmd.Name() == "hgetall" && len(args) > 1 && args[1] == reg
	}
}

// lostSignal is an Observer that tells when a lease is lost (an eviction seen). With
// hold set, a loss of agent holdFor then waits for hold to close: the lease's end is
// kept between the Observer and the cancellation of its context.
type lostSignal struct {
	lost    chan string
	hold    chan struct{}
	holdFor string
}

func (o lostSignal) Acquired(string)                 {}
func (o lostSignal) Busy(string)                     {}
func (o lostSignal) Conflict(string, string, string) {}
func (o lostSignal) Released(string, time.Duration)  {}
func (o lostSignal) Lost(agent string, _ error) {
	select {
	case o.lost <- agent:
	default:
	}
	if o.hold != nil && agent == o.holdFor {
		<-o.hold
	}
}

// newPauseBatchEnv is newBatchEnv with the pauses configured (as every worker has
// them), every run quick, and the pause checks counted.
func newPauseBatchEnv(t *testing.T, obs lease.Observer, issues ...string) (*batchEnv, *cmdCounter) {
	t.Helper()
	e := newBatchEnv(t, issues...)
	l, err := lease.New(e.l.Client(), lease.Options{Scope: e.ns, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	e.l = l
	pc := &cmdCounter{match: pauseReads(l.Pauses().Keys().Reg)}
	l.Client().(*redis.Client).AddHook(pc)
	e.mw, err = lockmw.NewMiddleware(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "triage", Source: e.src,
		MaxIdleTime: time.Hour, OnConflict: recordTo(e.ns + "results"), Pauses: l.Pauses()})
	if err != nil {
		t.Fatal(err)
	}
	e.mw.SetBatchTiming(time.Hour, time.Millisecond)
	t.Cleanup(func() { e.mw.Close(context.Background()) })
	return e, pc
}

func rhel(n int) []string {
	issues := make([]string, n)
	for i := range issues {
		issues[i] = "RHEL-" + strconv.Itoa(i+1)
	}
	return issues
}

// With no pause, a lease taken ahead in a batch had its pause check made in the
// batch's script: a burst of quick events costs no pause round trip per event.
func TestQuickBatchesCheckPausesInTheirScript(t *testing.T) {
	t.Parallel()
	issues := rhel(24)
	e, pc := newPauseBatchEnv(t, nil, issues...)
	if ran := e.run(t); len(ran) != len(issues) {
		t.Fatalf("ran %d events, want %d", len(ran), len(issues))
	}
	e.settledAll(t)
	// The first event takes its own lease and checks; those taken ahead do not.
	if n := pc.n.Load(); n > int64(len(issues))/4 {
		t.Fatalf("%d pause checks of their own for %d quick events, want at most %d", n, len(issues), len(issues)/4)
	}
}

// With a pause present, the events of the paused scope are parked as before (each
// event checks: the batch's script saw the registry non-empty), the others run.
func TestQuickBatchesParkPausedScope(t *testing.T) {
	t.Parallel()
	e, _ := newPauseBatchEnv(t, nil, rhel(8)...)
	ctx := context.Background()
	if _, err := e.l.Pauses().Set(ctx, lease.Pause{Scope: "issue:RHEL-3", Reason: "test", By: "test"}); err != nil {
		t.Fatal(err)
	}
	ran := e.run(t)
	if slices.Contains(ran, "RHEL-3") || len(ran) != 7 {
		t.Fatalf("ran %v, want every issue but the paused RHEL-3", ran)
	}
	parked, err := e.l.Pauses().Parked(ctx, "issue:RHEL-3")
	if err != nil || len(parked) != 1 || parked[0].LineID != e.ids[2] {
		t.Fatalf("parked %v %v, want RHEL-3's entry %s", parked, err, e.ids[2])
	}
	e.settledAll(t)
}

// A pause written while leases are taken ahead (their check made in the batch, no
// pause then) lists them, and --stop-running's force release reaches them: the event
// whose lease it took is checked then, and parked, not run. The loss is held between
// the Observer and the lease's context (lostSignal.hold): the Observer heard of it
// first, and the event is checked all the same (Lease.Held). CI once ran RHEL-4 in
// that window.
func TestPauseStopsLeaseTakenAhead(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	obs := lostSignal{lost: make(chan string, 1), hold: hold, holdFor: "triage"}
	e, _ := newPauseBatchEnv(t, obs, rhel(6)...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = e.l.WatchEvictions(ctx) }()
	// The watch is in place once an eviction reaches a lease (its catch-up would
	// otherwise end it too, later).
	probe, err := e.l.Acquire(ctx, "probe", "RHEL-99", lease.AcquireOptions{MessageID: "1-1"})
	if err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		_, _ = e.l.ForceRelease(ctx, "probe", "RHEL-99")
		return probe.Context().Err() != nil
	}, "the eviction watch to end the probe's lease")
	<-obs.lost
	var ran []string
	h := e.mw.Handler(func(msg *message.Message) ([]*message.Message, error) {
		issue := msg.Metadata.Get("issue_key")
		ran = append(ran, issue)
		if issue != "RHEL-2" {
			return nil, nil
		}
		// RHEL-1's batch took RHEL-2..6 ahead. The operator pauses RHEL-4 with
		// --stop-running: its lease taken ahead is listed, and force-released.
		if _, err := e.l.Pauses().Set(ctx, lease.Pause{Scope: "issue:RHEL-4", Reason: "test", By: "test", StopRunning: true}); err != nil {
			t.Error(err)
		}
		live, err := e.l.List(ctx, "triage")
		if err != nil || !slices.ContainsFunc(live, func(i lease.Info) bool { return i.Issue == "RHEL-4" && i.MessageID == e.ids[3] }) {
			t.Errorf("the leases live after the pause %v %v do not name RHEL-4's, taken ahead", live, err)
		}
		if _, err := e.l.ForceRelease(ctx, "triage", "RHEL-4"); err != nil {
			t.Error(err)
		}
		deadline := time.After(5 * time.Second)
		for seen := false; !seen; {
			select {
			case agent := <-obs.lost:
				seen = agent == "triage" // not a late word of the probe's loss
			case <-deadline:
				t.Error("the eviction of RHEL-4's lease taken ahead was not seen")
				seen = true
			}
		}
		return nil, nil
	})
	for len(e.src.Waiting()) > 0 {
		issue := e.src.Waiting()[0].IssueKey
		if _, err := h(message.NewMessage("u", []byte(`{"metadata":{"issue":"`+issue+`"}}`))); err != nil {
			t.Fatal(err)
		}
	}
	release()
	if slices.Contains(ran, "RHEL-4") || len(ran) != 5 {
		t.Fatalf("ran %v, want every issue but RHEL-4, stopped by the pause", ran)
	}
	parked, err := e.l.Pauses().Parked(ctx, "issue:RHEL-4")
	if err != nil || len(parked) != 1 || parked[0].LineID != e.ids[3] {
		t.Fatalf("parked %v %v, want RHEL-4's entry %s", parked, err, e.ids[3])
	}
	e.settledAll(t)
}
