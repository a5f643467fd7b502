package handlers_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/handlers"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/runners"
)

// quietAgent reports progress on its control channel every 50 ms for talk, then goes
// quiet until its run is stopped, and records why.
type quietAgent struct {
	talk time.Duration

	mu     sync.Mutex
	runs   int
	cause  error
	talked time.Duration // how long the first run lasted
}

func (a *quietAgent) Run(ctx context.Context, req runners.RunRequest) (runners.Result, error) {
	a.mu.Lock()
	a.runs++
	first := a.runs == 1
	a.mu.Unlock()
	if !first || req.Control == nil {
		return runners.Result{Success: true}, nil
	}
	ours, theirs := net.Pipe()
	go func() { _ = req.Control.Serve(ctx, ours); _ = ours.Close() }()
	defer func() { _ = theirs.Close() }()
	r := bufio.NewReader(theirs)
	start := time.Now()
	for seq := int64(1); time.Since(start) < a.talk; seq++ {
		line := `{"id":"p","op":"progress","fence":` + itoa64(req.Fence) + `,"seq":` + itoa64(seq) + "}\n"
		if _, err := theirs.Write([]byte(line)); err != nil {
			break
		}
		if _, err := r.ReadBytes('\n'); err != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	<-ctx.Done() // quiet: a wedged agent
	a.mu.Lock()
	a.cause, a.talked = context.Cause(ctx), time.Since(start)
	a.mu.Unlock()
	return runners.Result{}, ctx.Err()
}

// PROGRESS_TIMEOUT: a run whose agent reports progress is left alone however long it
// takes; once it goes quiet for the timeout its lease is given up, as a wedged
// handler's at MaxHold: the runner is stopped with the cause ErrNoProgress, the lease
// released, and the event dead-lettered with that reason (an operator's requeue runs
// it again, from its last checkpoint), not retried in a loop.
func TestProgressTimeoutEndsAQuietRun(t *testing.T) {
	t.Parallel()
	const key = "RHEL-397"
	e := newEnv(t, fakejira.Issue{Key: key})
	ledger, err := agentctl.NewLedger(e.rdb, e.ns, agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The timeout is 20 progress reports long: a busy machine's scheduling stall between
	// two reports is far shorter, and the quiet part still ends the run within a second.
	const talk, timeout = 2 * time.Second, time.Second
	agent := &quietAgent{talk: talk}
	e.router(ctx, "rebase", "c9s", e.handler("rebase", "c9s", agent, func(c *handlers.Config) {
		c.Ledger = ledger
		c.Control.ProgressTimeout = timeout
	}), 3)
	if _, err := e.pub.PublishID(ctx, e.topo.Stream("rebase", "c9s", false), downstreamMsg(t, "rebase", key, "c9s", false)); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 30*time.Second, func() bool { return e.rdb.XLen(ctx, e.topo.Dead()).Val() == 1 },
		"the quiet run is stopped and its event dead-lettered")
	dead, _ := e.rdb.XRange(ctx, e.topo.Dead(), "-", "+").Result()
	if reason := fmt.Sprint(dead[0].Values); !strings.Contains(reason, "no progress") {
		t.Errorf("dead letter %s: want the reason", reason)
	}
	lock := e.locker().LockKey("rebase", key)
	redistest.Eventually(t, 10*time.Second, func() bool { return e.rdb.Exists(ctx, lock).Val() == 0 }, "the lease released")
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if !errors.Is(agent.cause, agentctl.ErrNoProgress) {
		t.Fatalf("the quiet run was stopped by %v, want ErrNoProgress", agent.cause)
	}
	if agent.talked < talk || agent.runs != 1 {
		t.Fatalf("the run lasted %s, %d runs: want it left alone while it reported progress (%s), and run once", agent.talked, agent.runs, talk)
	}
}
