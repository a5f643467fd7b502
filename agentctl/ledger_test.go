package agentctl_test

import (
	"context"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/agentctl"
)

const usd = 1_000_000 // micro-USD

// A reservation counts against the issue's budget for every agent, until the usage
// report settles it; a denial names whose budget.
func TestReserveAgainstIssueAndAgentBudgets(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1, Agent: 0.7}, time.Minute)
	_, a := w.acquire(t, "triage", "RHEL-1")
	_, b := w.acquire(t, "rebase", "RHEL-1")

	if g, err := w.ledger.Reserve(ctx, a, 1, usd*6/10); err != nil || g.Status != agentctl.StatusGranted {
		t.Fatalf("first reservation: %+v %v", g, err)
	}
	if g, _ := w.ledger.Reserve(ctx, b, 1, usd*6/10); g.Status != agentctl.StatusDenied || g.Reason != "issue" || g.Reserved != usd*6/10 {
		t.Fatalf("a second 0.6 of a budget of 1 while 0.6 is reserved: %+v, want denied by the issue", g)
	}
	if g, _ := w.ledger.Reserve(ctx, a, 2, usd*2/10); g.Status != agentctl.StatusDenied || g.Reason != "agent" {
		t.Fatalf("0.8 for one agent with an agent budget of 0.7: %+v, want denied by the agent", g)
	}
	if st, spent, err := w.ledger.Report(ctx, a, 3, agentctl.Usage{Model: "m", Micro: usd / 2, TokensIn: 10}); err != nil || st != agentctl.StatusCounted || spent != usd/2 {
		t.Fatalf("report: %s %d %v", st, spent, err)
	}
	if g, _ := w.ledger.Reserve(ctx, b, 2, usd*5/10); g.Status != agentctl.StatusGranted || g.Spent != usd/2 {
		t.Fatalf("0.5 after 0.5 spent and the reservation settled: %+v, want granted", g)
	}
}

// A report retried with the same seq (its reply was lost) is counted once, and a
// reservation retried gets its first answer without reserving twice.
func TestRetriesCountOnce(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	_, a := w.acquire(t, "triage", "RHEL-2")
	for range 3 {
		if g, _ := w.ledger.Reserve(ctx, a, 1, usd*4/10); g.Status != agentctl.StatusGranted || g.Reserved != usd*4/10 {
			t.Fatalf("reserve seq 1 again: %+v, want granted once (0.4 reserved)", g)
		}
	}
	for range 3 {
		if st, spent, _ := w.ledger.Report(ctx, a, 2, agentctl.Usage{Model: "m", Micro: usd / 4}); st != agentctl.StatusCounted || spent != usd/4 {
			t.Fatalf("report seq 2 again: %s spent %d, want counted once (0.25)", st, spent)
		}
	}
	if st, _, _ := w.ledger.Report(ctx, a, 1, agentctl.Usage{Model: "m", Micro: usd}); st != agentctl.StatusStaleSeq {
		t.Fatalf("a report with an older seq: %s, want stale_seq", st)
	}
	if got := w.spent(t, "RHEL-2"); got != usd/4 {
		t.Fatalf("spent %d, want %d", got, usd/4)
	}
}

// A superseded run (its lease lost and taken by a newer run) is refused whatever it
// asks, and its open reservation is void for everyone else.
func TestStaleRunRefusedAndItsReservationVoid(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	old, a := w.acquire(t, "triage", "RHEL-3")
	if g, _ := w.ledger.Reserve(ctx, a, 1, usd*9/10); g.Status != agentctl.StatusGranted {
		t.Fatal(g)
	}
	if _, err := w.locker.ForceRelease(ctx, "triage", "RHEL-3"); err != nil {
		t.Fatal(err)
	}
	_ = old
	_, b := w.acquire(t, "triage", "RHEL-3")
	if b.Fence <= a.Fence {
		t.Fatalf("fences %d then %d", a.Fence, b.Fence)
	}
	if g, _ := w.ledger.Reserve(ctx, b, 1, usd*9/10); g.Status != agentctl.StatusGranted {
		t.Fatalf("the newer run's reservation while the old one's is void: %+v", g)
	}
	if st, _, _ := w.ledger.Report(ctx, a, 2, agentctl.Usage{Model: "m", Micro: usd}); st != agentctl.StatusStaleFence {
		t.Fatalf("the superseded run's usage: %s, want stale_fence", st)
	}
	if st, _ := w.ledger.SaveCheckpoint(ctx, a, 3, []byte(`{"plan":"old"}`)); st != agentctl.StatusStaleFence {
		t.Fatalf("the superseded run's checkpoint: %s, want stale_fence", st)
	}
	if g, _ := w.ledger.Reserve(ctx, a, 4, 1); g.Status != agentctl.StatusStaleFence {
		t.Fatalf("the superseded run's reservation: %+v, want stale_fence", g)
	}
	if got := w.spent(t, "RHEL-3"); got != 0 {
		t.Fatalf("spent %d, want 0", got)
	}
}

// A dead run's reservation is free once its lease expires (no release, no report).
func TestDeadRunsReservationFreeAtExpiry(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	_, a := w.acquire(t, "triage", "RHEL-4")
	if g, _ := w.ledger.Reserve(ctx, a, 1, usd); g.Status != agentctl.StatusGranted {
		t.Fatal(g)
	}
	_, b := w.acquire(t, "rebase", "RHEL-4")
	if g, _ := w.ledger.Reserve(ctx, b, 1, usd/10); g.Status != agentctl.StatusDenied {
		t.Fatalf("while the triage run lives: %+v, want denied", g)
	}
	// The worker died: its lease expires (the heartbeat stopped); expire it now.
	if err := w.rdb.PExpire(ctx, a.LockKey, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.rdb.Exists(ctx, a.LockKey).Val() == 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if g, _ := w.ledger.Reserve(ctx, b, 2, usd/10); g.Status != agentctl.StatusGranted {
		t.Fatalf("after the dead run's lease expired: %+v, want granted", g)
	}
}

// Checkpoints: saved under the fence, read back, never replaced by an older fence.
func TestCheckpointFenced(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{}, time.Minute)
	le, a := w.acquire(t, "rebase", "RHEL-5")
	if st, err := w.ledger.SaveCheckpoint(ctx, a, 1, []byte(`{"steps":["a"]}`)); err != nil || st != agentctl.StatusSaved {
		t.Fatalf("save: %s %v", st, err)
	}
	if _, err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, b := w.acquire(t, "rebase", "RHEL-5")
	ck, ok, err := w.ledger.LastCheckpoint(ctx, "rebase", "RHEL-5")
	if err != nil || !ok || string(ck.Data) != `{"steps":["a"]}` || ck.Fence != a.Fence {
		t.Fatalf("last checkpoint %+v %v %v", ck, ok, err)
	}
	if st, _ := w.ledger.SaveCheckpoint(ctx, b, 1, []byte(`{"steps":["a","b"]}`)); st != agentctl.StatusSaved {
		t.Fatal(st)
	}
	if st, _ := w.ledger.SaveCheckpoint(ctx, a, 2, []byte(`{"steps":[]}`)); st != agentctl.StatusStaleFence {
		t.Fatalf("the old run's late checkpoint: %s, want stale_fence", st)
	}
	if ck, _, _ := w.ledger.LastCheckpoint(ctx, "rebase", "RHEL-5"); string(ck.Data) != `{"steps":["a","b"]}` {
		t.Fatalf("checkpoint %s", ck.Data)
	}
}

// An approval raises the budget once, however often it is delivered.
func TestRaiseOnce(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	_, a := w.acquire(t, "triage", "RHEL-6")
	if g, _ := w.ledger.Reserve(ctx, a, 1, usd*15/10); g.Status != agentctl.StatusDenied {
		t.Fatal(g)
	}
	for range 2 {
		if total, err := w.ledger.Raise(ctx, "RHEL-6", 1, "comment-10042"); err != nil || total != 1 {
			t.Fatalf("raise: %v %v", total, err)
		}
	}
	if g, _ := w.ledger.Reserve(ctx, a, 2, usd*15/10); g.Status != agentctl.StatusGranted || g.Budget != 2*usd {
		t.Fatalf("after the raise: %+v", g)
	}
	if _, err := w.ledger.Raise(ctx, "RHEL-6", -1, "x"); err == nil {
		t.Fatal("a negative raise was accepted")
	}
}
