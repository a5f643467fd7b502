package agentctl_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/agentctl"
)

// serve runs ch on one end of a pipe and returns the agent's end.
func serve(t *testing.T, ch *agentctl.Channel) (net.Conn, chan error) {
	t.Helper()
	ours, theirs := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- ch.Serve(context.Background(), ours); _ = ours.Close() }()
	t.Cleanup(func() { _ = theirs.Close() })
	return theirs, done
}

// ask writes line and reads one answer.
func ask(t *testing.T, c net.Conn, r *bufio.Reader, line string) agentctl.Answer {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	raw, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var a agentctl.Answer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return a
}

// Every field is validated: a bad request is answered bad_request, naming the field,
// and nothing is counted; a line over MaxLine is refused whole.
func TestChannelValidates(t *testing.T) {
	w := newWorld(t, agentctl.Budgets{}, time.Minute)
	_, run := w.acquire(t, "triage", "RHEL-20")
	c, _ := serve(t, w.ledger.Open(run, agentctl.ChannelOptions{}))
	r := bufio.NewReader(c)
	f := `"fence":` + itoa(run.Fence)
	for _, tc := range []struct{ line, want string }{
		{`not json`, "not a request"},
		{`{"id":"1","op":"usage",` + f + `,"seq":1,"model":"m","cost_usd":-1}`, "cost_usd"},
		{`{"id":"1","op":"usage",` + f + `,"seq":1,"model":"m","cost_usd":1e9}`, "cost_usd"},
		{`{"id":"1","op":"usage",` + f + `,"seq":1,"model":"a b","cost_usd":1}`, "model"},
		{`{"id":"1","op":"usage","fence":999999,"seq":1,"model":"m"}`, "not this run's"},
		{`{"id":"1","op":"usage",` + f + `,"seq":0,"model":"m"}`, "seq"},
		{`{"id":"1","op":"reserve",` + f + `,"seq":1,"amount_usd":0}`, "amount_usd"},
		{`{"id":"1","op":"checkpoint",` + f + `,"seq":1,"checkpoint":[1]}`, "checkpoint"},
		{`{"id":"1","op":"permit",` + f + `,"seq":1,"upstream":"redis"}`, "upstream"},
		{`{"id":"1","op":"rm -rf",` + f + `,"seq":1}`, "unknown"},
		{`{"id":"1","op":"usage",` + f + `,"seq":1,"model":"m","token":"x"}`, "unknown field"},
		{`{"id":"` + strings.Repeat("x", 65) + `","op":"usage",` + f + `,"seq":1,"model":"m"}`, "id"},
		{`{"id":"1","op":"checkpoint",` + f + `,"seq":1,"checkpoint":{"a":"` + strings.Repeat("x", agentctl.MaxLine) + `"}}`, "at most"},
	} {
		if a := ask(t, c, r, tc.line); a.Status != agentctl.StatusBadRequest || !strings.Contains(a.Reason, tc.want) {
			t.Errorf("%.80s: %+v, want bad_request naming %q", tc.line, a, tc.want)
		}
	}
	if got := w.spent(t, "RHEL-20"); got != 0 {
		t.Fatalf("spent %d after bad requests", got)
	}
	// The channel still works.
	if a := ask(t, c, r, `{"id":"ok","op":"usage",`+f+`,"seq":1,"model":"m","cost_usd":0.5}`); a.Status != agentctl.StatusCounted || a.ID != "ok" {
		t.Fatalf("a good request after bad ones: %+v", a)
	}
}

// A run flooding its channel is answered rate_limited, then disconnected.
func TestChannelRateLimitAndAbuse(t *testing.T) {
	w := newWorld(t, agentctl.Budgets{}, time.Minute)
	_, run := w.acquire(t, "triage", "RHEL-21")
	c, done := serve(t, w.ledger.Open(run, agentctl.ChannelOptions{Limits: agentctl.Limits{Rate: 0.001, Burst: 2, MaxStrikes: 3}}))
	r := bufio.NewReader(c)
	line := `{"id":"1","op":"permit","fence":` + itoa(run.Fence) + `,"seq":1,"upstream":"jira"}`
	for i, want := range []string{agentctl.StatusGranted, agentctl.StatusGranted, agentctl.StatusRateLimited, agentctl.StatusRateLimited} {
		if a := ask(t, c, r, line); a.Status != want {
			t.Fatalf("request %d: %+v, want %s", i, a, want)
		}
	}
	_, _ = c.Write([]byte(line + "\n"))
	select {
	case err := <-done:
		if !errors.Is(err, agentctl.ErrChannelAbuse) {
			t.Fatalf("channel ended with %v, want ErrChannelAbuse", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flooding agent was not disconnected")
	}
}

// A superseded run's late usage and checkpoint are refused through its channel; the
// reservation its channel held is void when the channel ends.
func TestChannelSupersededRefusedAndVoidAtEnd(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	_, run := w.acquire(t, "rebase", "RHEL-22")
	ch := w.ledger.Open(run, agentctl.ChannelOptions{})
	c, done := serve(t, ch)
	r := bufio.NewReader(c)
	f := `"fence":` + itoa(run.Fence)
	if a := ask(t, c, r, `{"id":"1","op":"reserve",`+f+`,"seq":1,"amount_usd":0.9}`); a.Status != agentctl.StatusGranted {
		t.Fatal(a)
	}
	_ = c.Close() // the run ends: its channel voids the reservation
	if err := <-done; err != nil {
		t.Fatalf("the channel ended with %v", err)
	}
	_, other := w.acquire(t, "triage", "RHEL-22")
	if g, _ := w.ledger.Reserve(ctx, other, 1, 900_000); g.Status != agentctl.StatusGranted {
		t.Fatalf("after the run's end: %+v, want its reservation void", g)
	}

	le, run2 := w.acquire(t, "backport", "RHEL-22")
	ch2 := w.ledger.Open(run2, agentctl.ChannelOptions{})
	c2, _ := serve(t, ch2)
	r2 := bufio.NewReader(c2)
	if _, err := w.locker.ForceRelease(ctx, "backport", "RHEL-22"); err != nil {
		t.Fatal(err)
	}
	_ = le
	w.acquire(t, "backport", "RHEL-22") // the newer run
	f2 := `"fence":` + itoa(run2.Fence)
	for _, line := range []string{
		`{"id":"u","op":"usage",` + f2 + `,"seq":1,"model":"m","cost_usd":0.1}`,
		`{"id":"c","op":"checkpoint",` + f2 + `,"seq":2,"checkpoint":{"plan":[]}}`,
	} {
		if a := ask(t, c2, r2, line); a.Status != agentctl.StatusStaleFence {
			t.Errorf("%s: %+v, want stale_fence", line, a)
		}
	}
	if _, ok, _ := w.ledger.LastCheckpoint(ctx, "backport", "RHEL-22"); ok {
		t.Error("the superseded run's checkpoint was saved")
	}
	if ch2.Totals().Reports != 0 {
		t.Error("the superseded run's usage was counted")
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// A permit's answer waits for the agent's turn, and the run's end ends that wait: the
// agent is answered at once, "unavailable", and the channel closes.
func TestChannelPermitWaitEndsWithTheRun(t *testing.T) {
	w := newWorld(t, agentctl.Budgets{}, time.Minute)
	_, run := w.acquire(t, "triage", "RHEL-23")
	p, err := agentctl.NewRedisPermits(w.rdb, w.ns, map[string]agentctl.Rate{"llm:x": {PerSecond: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer // read once Serve has returned
	ch := w.ledger.Open(run, agentctl.ChannelOptions{Permits: p, Logger: zerolog.New(&logged)})
	ours, theirs := net.Pipe()
	t.Cleanup(func() { _ = theirs.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ch.Serve(ctx, ours); _ = ours.Close() }()
	r := bufio.NewReader(theirs)
	f := `"fence":` + itoa(run.Fence)
	if a := ask(t, theirs, r, `{"id":"1","op":"permit",`+f+`,"seq":1,"upstream":"llm:x"}`); a.Status != agentctl.StatusGranted {
		t.Fatalf("first permit: %+v", a)
	}
	answered := make(chan agentctl.Answer, 1)
	go func() {
		var a agentctl.Answer
		if _, err := theirs.Write([]byte(`{"id":"2","op":"permit",` + f + `,"seq":2,"upstream":"llm:x"}` + "\n")); err == nil {
			if raw, err := r.ReadBytes('\n'); err == nil {
				_ = json.Unmarshal(raw, &a)
			}
		}
		answered <- a
	}()
	time.Sleep(100 * time.Millisecond) // the second waits for its turn, a second away
	select {
	case a := <-answered:
		t.Fatalf("second permit answered before its turn: %+v", a)
	default:
	}
	ended := time.Now()
	cancel()
	if a := <-answered; a.Status != agentctl.StatusUnavailable {
		t.Errorf("permit waiting when the run ended: %+v, want unavailable", a)
	}
	if took := time.Since(ended); took > 500*time.Millisecond {
		t.Errorf("answered %s after the run ended, want at once (its turn was a second away)", took)
	}
	if err := <-done; err != nil {
		t.Errorf("the channel ended with %v", err)
	}
	if strings.Contains(logged.String(), `"level":"warn"`) {
		t.Errorf("the run's end was logged as a failure: %s", logged.String())
	}
}
