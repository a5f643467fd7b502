package web_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The issue page shows the issue's spend from the agents' ledger: a row per agent,
// the total, and a maintainer's budget raise; an issue with nothing reported shows no
// spend section.
func TestIssuePageShowsSpend(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx := context.Background()
	e.publish("RHEL-21")
	e.publish("RHEL-22")
	ledger, err := agentctl.NewLedger(e.rdb, e.topo.Namespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	for i, agent := range []string{"triage", "rebase"} {
		le, err := e.locker.Acquire(ctx, agent, "RHEL-21", lease.AcquireOptions{MessageID: "1-0"})
		if err != nil {
			t.Fatal(err)
		}
		if st, _, err := ledger.Report(ctx, agentctl.RunOf(le), 1, agentctl.Usage{Model: "m", TokensIn: 1000, TokensOut: 10,
			Micro: int64(i+1) * 1_250_000, ToolCalls: 2}); err != nil || st != agentctl.StatusCounted {
			t.Fatalf("report %s: %q %v", agent, st, err)
		}
		_, _ = le.Release(ctx)
	}
	if _, err := ledger.Raise(ctx, "RHEL-21", 10, "c-1"); err != nil {
		t.Fatal(err)
	}

	_, body := e.get("/issue?key=rhel-21&fragment=1")
	rows := regexp.MustCompile(`<tr><td>rebase</td><td class="num">2\.5000</td></tr><tr><td>triage</td><td class="num">1\.2500</td></tr>\s*` +
		`<tr class="total"><td>total</td><td class="num cost-total">3\.7500</td></tr>`)
	if !rows.MatchString(body) || !strings.Contains(body, "2 report(s), 2000 tokens in, 20 out, 4 tool call(s); budget raised by 10.00 USD") {
		t.Errorf("issue page without the spend:\n%s", body)
	}
	if _, body := e.get("/issue?key=RHEL-22&fragment=1"); strings.Contains(body, `id="cost"`) {
		t.Errorf("an issue with no spend shows a spend section:\n%s", body)
	}
}

// The leases page shows the wait policy's line of a lease: "2 waiting, oldest Ns".
func TestLeasesPageShowsTheLine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx := context.Background()
	wait := func(id string) lease.AcquireOptions {
		return lease.AcquireOptions{Owner: "pod-w-0", MessageID: id, Wait: &lease.WaitOptions{LineID: id,
			Event: lease.QueuedEvent{Stream: e.topo.Stream("rebase", "c9s", false), Fields: map[string]any{"x": "1"}}}}
	}
	holder, err := e.locker.Acquire(ctx, "rebase", "RHEL-23", wait("1-0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = holder.Release(context.Background()) })
	_, body := e.get("/leases?fragment=1")
	if !strings.Contains(body, `<td class="line"></td>`) {
		t.Errorf("a lease with nobody waiting:\n%s", body)
	}
	for _, id := range []string{"2-0", "3-0"} {
		if _, err := e.locker.Acquire(ctx, "rebase", "RHEL-23", wait(id)); !errors.Is(err, lease.ErrLocked) {
			t.Fatalf("event %s: %v", id, err)
		}
	}
	_, body = e.get("/leases?fragment=1")
	if !regexp.MustCompile(`<td class="line">2 waiting, oldest \d+s</td>`).MatchString(body) {
		t.Errorf("leases page without the line:\n%s", body)
	}
}
