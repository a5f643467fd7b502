package runners_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/ymirflow/ymirflow/runners"
)

// echoControl answers each line with "ok <line>" and says it is exhausted when told.
type echoControl struct {
	mu        sync.Mutex
	lines     []string
	exhausted bool
}

func (c *echoControl) Serve(ctx context.Context, rw io.ReadWriter) error {
	sc := bufio.NewScanner(rw)
	for sc.Scan() {
		c.mu.Lock()
		c.lines = append(c.lines, sc.Text())
		c.mu.Unlock()
		if _, err := io.WriteString(rw, "ok "+sc.Text()+"\n"); err != nil {
			return err
		}
	}
	return sc.Err()
}

func (c *echoControl) Exhausted() bool { return c.exhausted }

// The agent gets its control channel as YMIR_CONTROL_FD, after the mailbox's fd 3: it
// writes a request and reads the answer on the same descriptor.
func TestExecRunnerControlChannel(t *testing.T) {
	for _, withMailbox := range []bool{false, true} {
		ctl := &echoControl{}
		r := runners.ExecRunner{Command: `fd=$YMIR_CONTROL_FD; eval "echo ping >&$fd; read ans <&$fd"; ` +
			`echo "{\"success\": true, \"error\": \"$ans fd $fd\"}"`}
		req := runReq(t, "rebase")
		req.Control = ctl
		want := "ok ping fd 3"
		if withMailbox {
			req.Mailbox = emptyMailbox{}
			want = "ok ping fd 4"
		}
		res, err := r.Run(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Error != want || strings.Join(ctl.lines, ",") != "ping" {
			t.Fatalf("mailbox %v: answer %q, lines %q; want %q", withMailbox, res.Error, ctl.lines, want)
		}
	}
}

type emptyMailbox struct{}

func (emptyMailbox) Next(ctx context.Context) ([]runners.Followup, error) {
	<-ctx.Done()
	return nil, nil
}

// A run that fails or reports no success after a reservation was denied for its budget
// ends with ErrBudgetExhausted (the handler parks the issue); one that succeeds anyway
// stands.
func TestExecRunnerBudgetExhausted(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		want error
	}{
		{`exit 3`, runners.ErrBudgetExhausted},
		{`echo '{"success": false, "error": "no budget"}'`, runners.ErrBudgetExhausted},
		{`echo '{"success": true}'`, nil},
	} {
		req := runReq(t, "rebase")
		req.Control = &echoControl{exhausted: true}
		_, err := runners.ExecRunner{Command: tc.cmd}.Run(context.Background(), req)
		if !errors.Is(err, tc.want) && (tc.want != nil || err != nil) {
			t.Errorf("%s: %v, want %v", tc.cmd, err, tc.want)
		}
	}
	// Without a denial, a failure is a plain failure.
	req := runReq(t, "rebase")
	req.Control = &echoControl{}
	if _, err := (runners.ExecRunner{Command: `exit 3`}).Run(context.Background(), req); err == nil || errors.Is(err, runners.ErrBudgetExhausted) {
		t.Fatalf("a failure without a denial: %v", err)
	}
}

func TestWithCheckpoint(t *testing.T) {
	out, err := runners.WithCheckpoint([]byte(`{"metadata":{"a":1},"x":2}`), []byte(`{"plan":["a"]}`))
	if err != nil || !strings.Contains(string(out), `"checkpoint":{"plan":["a"]}`) || !strings.Contains(string(out), `"x":2`) {
		t.Fatalf("%s %v", out, err)
	}
	if _, err := runners.WithCheckpoint([]byte(`{}`), []byte(`{bad`)); err == nil {
		t.Fatal("a checkpoint that is not JSON was accepted")
	}
}
