package pipeline_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/drainreq"
	"github.com/ymirflow/ymirflow/internal/presence"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// ranBy records which worker ran each issue, and how often.
type ranBy struct {
	mu   sync.Mutex
	by   map[string][]string
	gate map[string]chan struct{} // an issue's handler waits on its gate
}

func (r *ranBy) handler(worker string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		key := issueOf(msg)
		r.mu.Lock()
		r.by[key] = append(r.by[key], worker)
		gate := r.gate[key]
		r.mu.Unlock()
		if gate != nil {
			<-gate
		}
		return nil
	}
}

func (r *ranBy) get(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.by[key]...)
}

// drainState reads the presence record of consumer.
func (e *env) drainState(consumer string) (string, bool) {
	for _, m := range e.rdb.ZRange(context.Background(), e.topo.Workers(), 0, -1).Val() {
		if b, ok := presence.Decode(m); ok && b.Consumer == consumer {
			return b.Drain, true
		}
	}
	return "", false
}

func (e *env) requestDrain(t drainreq.Target, reason string) {
	r := drainreq.Request{Target: t, Who: "test", Reason: reason, At: time.Now()}
	e.rdb.HSet(context.Background(), e.topo.Drains(), t.Field(), r.Encode())
}

// TestDrainWorker: a worker drained while it runs an event and holds two entries read
// ahead lets that event finish, gives the two back (another worker runs them at once,
// not after MAX_IDLE_TIME), starts nothing new, and reports draining, then drained, in
// its presence record; undrained, it runs events again. Each event runs once.
func TestDrainWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &ranBy{by: map[string][]string{}, gate: map[string]chan struct{}{"RHEL-1": make(chan struct{})}}
	cfg := e.Config("triage", "", "w1", e.locker(3*time.Second), r.handler("w1"))
	cfg.MaxIdleTime = time.Minute // a give-back, not the idle time, lets w2 take them
	e.Start(ctx, cfg)
	e.publishTriage("RHEL-1")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(r.get("RHEL-1")) == 1 }, "RHEL-1 runs")
	e.publishTriage("RHEL-2")
	e.publishTriage("RHEL-3")
	redistest.Eventually(t, 10*time.Second, func() bool { return e.pending(e.triage()) == 3 }, "two read ahead")
	e.requestDrain(drainreq.Target{Worker: "w1"}, "upgrade")
	redistest.Eventually(t, 10*time.Second, func() bool { s, _ := e.drainState("w1-0"); return s == drainreq.Draining }, "w1 draining")
	w2ctx, stopW2 := context.WithCancel(ctx)
	cfg2 := e.Config("triage", "", "w2", e.locker(3*time.Second), r.handler("w2"))
	cfg2.MaxIdleTime = time.Minute
	_, w2done := e.Start(w2ctx, cfg2)
	redistest.Eventually(t, 10*time.Second, func() bool { return len(r.get("RHEL-2")) == 1 && len(r.get("RHEL-3")) == 1 },
		"w2 runs what w1 gave back")
	if s, _ := e.drainState("w1-0"); s != drainreq.Draining {
		t.Fatalf("w1 is %q while RHEL-1 runs, want draining", s)
	}
	close(r.gate["RHEL-1"])
	redistest.Eventually(t, 10*time.Second, func() bool { s, _ := e.drainState("w1-0"); return s == drainreq.Drained }, "w1 drained")
	e.publishTriage("RHEL-4")
	redistest.Eventually(t, 10*time.Second, func() bool { return len(r.get("RHEL-4")) == 1 }, "RHEL-4 runs")
	for _, k := range []string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-4"} {
		want := "w2"
		if k == "RHEL-1" {
			want = "w1"
		}
		if got := r.get(k); len(got) != 1 || got[0] != want {
			t.Errorf("%s ran on %v, want once on %s", k, got, want)
		}
	}
	// Undrained (w2 stopped), w1 runs again.
	stopW2()
	if err := <-w2done; err != nil {
		t.Fatalf("w2 stopped: %v", err)
	}
	e.rdb.HDel(ctx, e.topo.Drains(), drainreq.Target{Worker: "w1"}.Field())
	redistest.Eventually(t, 10*time.Second, func() bool { s, ok := e.drainState("w1-0"); return ok && s == "" }, "w1 undrained")
	e.publishTriage("RHEL-5")
	redistest.Eventually(t, 10*time.Second, func() bool { g := r.get("RHEL-5"); return len(g) == 1 && g[0] == "w1" }, "w1 runs RHEL-5")
	// Acked with its release, after the handler has returned (a quick run's end may
	// wait a millisecond for its batch).
	redistest.Eventually(t, 5*time.Second, func() bool { return e.pending(e.triage()) == 0 }, "nothing left pending")
}

// TestWorkerStartsDrained: a worker started while a drain request for its agent
// stands reads nothing and reports drained; the request's end lets it run.
func TestWorkerStartsDrained(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.requestDrain(drainreq.Target{Agent: "triage"}, "maintenance")
	e.requestDrain(drainreq.Target{Agent: "rebase", Branch: "c9s"}, "another agent's")
	e.publishTriage("RHEL-1")
	r := &ranBy{by: map[string][]string{}, gate: map[string]chan struct{}{}}
	_, _ = e.Start(ctx, e.Config("triage", "", "w1", e.locker(3*time.Second), r.handler("w1")))
	redistest.Eventually(t, 10*time.Second, func() bool { s, _ := e.drainState("w1-0"); return s == drainreq.Drained }, "w1 drained")
	if n := e.pending(e.triage()); n != 0 || len(r.get("RHEL-1")) != 0 {
		t.Fatalf("a worker started drained read %d entries, ran %v", n, r.get("RHEL-1"))
	}
	e.rdb.HDel(ctx, e.topo.Drains(), drainreq.Target{Agent: "triage"}.Field())
	redistest.Eventually(t, 10*time.Second, func() bool { return len(r.get("RHEL-1")) == 1 }, "RHEL-1 runs once undrained")
}
