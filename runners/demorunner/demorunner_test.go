package demorunner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/runners"
	"github.com/ymirflow/ymirflow/runners/demorunner"
)

func TestDemoRunnerIsDeterministic(t *testing.T) {
	t.Parallel()
	d := demorunner.Runner{Seed: 7}
	ctx := context.Background()
	for i := range 50 {
		key := fmt.Sprintf("RHEL-%d", 100+i)
		for _, agent := range []string{"triage", "rebase"} {
			req := runners.RunRequest{Agent: agent, IssueKey: key, Attempt: 1}
			a, errA := d.Run(ctx, req)
			b, errB := demorunner.Runner{Seed: 7}.Run(ctx, req)
			if fmt.Sprint(a, errA) != fmt.Sprint(b, errB) {
				t.Fatalf("%s %s: %v/%v then %v/%v", agent, key, a, errA, b, errB)
			}
		}
	}
	// The mix is honoured: over many issues each outcome shows up about as often as
	// its weight says, and the seed changes which issue gets which.
	counts := map[string]int{}
	differ := 0
	for i := range 2000 {
		key := fmt.Sprintf("RHEL-%d", i+1)
		o, branch, _ := d.Outcome("triage", key, 1)
		counts[o]++
		if o2, _, _ := (demorunner.Runner{Seed: 8}).Outcome("triage", key, 1); o2 != o {
			differ++
		}
		if branch == "" {
			t.Fatal("no branch from the default branches")
		}
	}
	for res, w := range demorunner.DefaultTriageMix {
		if got, want := counts[res], 2000*w/100; got < want*6/10-10 || got > want*14/10+10 {
			t.Errorf("%s: %d of 2000, want about %d", res, got, want)
		}
	}
	if differ < 500 {
		t.Errorf("seed 7 and 8 agree on %d of 2000 issues", 2000-differ)
	}
	// Attempts differ, so a retry can succeed.
	changed := 0
	for i := range 200 {
		key := fmt.Sprintf("RHEL-%d", i+1)
		a, _, _ := d.Outcome("rebase", key, 1)
		b, _, _ := d.Outcome("rebase", key, 2)
		if a != b {
			changed++
		}
	}
	if changed == 0 {
		t.Error("the attempt never changes the outcome")
	}
}

func TestDemoRunnerMixDurationAndCancel(t *testing.T) {
	t.Parallel()
	d := demorunner.Runner{Mix: map[string]int{"rebase": 1, "error": 0}, Branches: []string{"c9s"}, Duration: 40 * time.Millisecond}
	start := time.Now()
	res, err := d.Run(context.Background(), runners.RunRequest{Agent: "triage", IssueKey: "RHEL-1", Attempt: 1})
	if err != nil || res.Resolution != "rebase" || res.TargetBranch != "c9s" || !bytes.Contains(res.Data, []byte(`"jira_issue":"RHEL-1"`)) {
		t.Fatalf("%+v %v", res, err)
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("took %s, want at least half the duration", took)
	}
	down := demorunner.Runner{Mix: map[string]int{demorunner.Failure: 1}}
	if res, err := down.Run(context.Background(), runners.RunRequest{Agent: "backport", IssueKey: "RHEL-1", Attempt: 1}); err != nil || res.Success || res.Error == "" {
		t.Fatalf("%+v %v", res, err)
	}
	crash := demorunner.Runner{Mix: map[string]int{demorunner.Crash: 1}}
	if _, err := crash.Run(context.Background(), runners.RunRequest{Agent: "rebuild", IssueKey: "RHEL-1", Attempt: 1}); !errors.Is(err, demorunner.ErrCrash) {
		t.Fatalf("err = %v", err)
	}
	slow := demorunner.Runner{Duration: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := slow.Run(ctx, runners.RunRequest{Agent: "rebase", IssueKey: "RHEL-1", Attempt: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("did not honour ctx")
	}
}

// oneFollowup is a mailbox that has one follow-up for the first read, then none.
type oneFollowup struct{ reads int }

func (m *oneFollowup) Next(ctx context.Context) ([]runners.Followup, error) {
	m.reads++
	if m.reads == 1 {
		return []runners.Followup{{ID: "1-0", Fields: map[string]string{"body": "also the tests"}}}, nil
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(5 * time.Millisecond):
		return nil, nil
	}
}

// With Followups, a run reads its mailbox while it works and acknowledges what it read
// (the handler records followup.delivered); without, it never reads it.
func TestDemoRunnerAcknowledgesFollowups(t *testing.T) {
	t.Parallel()
	req := runners.RunRequest{Agent: "rebase", IssueKey: "RHEL-7", Attempt: 1}
	for _, on := range []bool{true, false} {
		mb := &oneFollowup{}
		req.Mailbox = mb
		res, err := demorunner.Runner{Seed: 1, Duration: 40 * time.Millisecond, Mix: map[string]int{demorunner.Success: 1}, Followups: on}.Run(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if on {
			want = 1
		}
		if len(res.FollowupsAcked) != want || len(res.Delivered) != want || (on && res.FollowupsAcked[0] != "1-0") || (!on && mb.reads != 0) {
			t.Fatalf("Followups %v: acked %v, delivered %v, %d reads", on, res.FollowupsAcked, res.Delivered, mb.reads)
		}
	}
}
