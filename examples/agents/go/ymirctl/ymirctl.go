// Package ymirctl is the agent's side of ymirflow's control channel (YMIR_CONTROL_FD),
// standard library only: one JSON request a line, one answer a line, on the descriptor
// the worker names (examples/agents/README.md, "The control channel").
//
//	ctl, err := ymirctl.FromEnv() // nil, nil when the worker gives no channel
//	ok, err := ctl.Reserve(0.10)  // before an expensive call; false: budget exhausted
//	err = ctl.Usage(ymirctl.Usage{Model: "claude", TokensIn: 1000, TokensOut: 200, CostUSD: 0.10})
//	err = ctl.Checkpoint(map[string]any{"plan": plan, "completed": done, "branch_sha": sha})
//	err = ctl.Permit(ctx, "llm:claude") // waits until the shared rate allows one call
//
// Every request carries the run's fence and a growing sequence number; one answered
// "unavailable" is sent again with the same number, and ymirflow counts it once.
// ErrStaleFence means the run no longer holds its lease: stop and write nothing more.
package ymirctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// Errors a caller handles.
var (
	ErrStaleFence    = errors.New("ymirctl: the run no longer holds its lease")
	ErrClosed        = errors.New("ymirctl: the worker closed the control channel")
	ErrBudgetExhaust = errors.New("ymirctl: budget exhausted")
)

// Answer is ymirflow's answer to one request.
type Answer struct {
	ID           string  `json:"id"`
	Status       string  `json:"status"`
	Reason       string  `json:"reason,omitempty"`
	SpentUSD     float64 `json:"spent_usd,omitempty"`
	ReservedUSD  float64 `json:"reserved_usd,omitempty"`
	BudgetUSD    float64 `json:"budget_usd,omitempty"`
	RetryAfterMS int64   `json:"retry_after_ms,omitempty"`
}

// Usage is one call's usage report.
type Usage struct {
	Model     string  `json:"model"`
	TokensIn  int64   `json:"tokens_in"`
	TokensOut int64   `json:"tokens_out"`
	CostUSD   float64 `json:"cost_usd"`
	ToolCalls int64   `json:"tool_calls"`
}

// Control is one run's channel. Safe for concurrent use (requests go one at a time).
type Control struct {
	mu    sync.Mutex
	conn  net.Conn
	r     *bufio.Reader
	fence int64
	seq   int64
}

// FromEnv opens the channel YMIR_CONTROL_FD names; nil, nil when it is unset.
func FromEnv() (*Control, error) {
	v := os.Getenv("YMIR_CONTROL_FD")
	if v == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil {
		return nil, fmt.Errorf("ymirctl: YMIR_CONTROL_FD=%q: %w", v, err)
	}
	fence, _ := strconv.ParseInt(os.Getenv("YMIR_FENCE"), 10, 64)
	f := os.NewFile(uintptr(fd), "ymir-control")
	conn, err := net.FileConn(f)
	_ = f.Close() // FileConn holds its own copy of the descriptor
	if err != nil {
		return nil, fmt.Errorf("ymirctl: YMIR_CONTROL_FD=%d: %w", fd, err)
	}
	return &Control{conn: conn, r: bufio.NewReader(conn), fence: fence}, nil
}

// Close closes the channel.
func (c *Control) Close() error { return c.conn.Close() }

// Request sends one request (fields besides id, op, fence and seq) and returns its
// answer; "unavailable" and "rate_limited" are asked again, with the same seq.
func (c *Control) Request(op string, fields map[string]any) (Answer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := map[string]any{}
	for k, v := range fields {
		req[k] = v
	}
	req["id"], req["op"], req["fence"], req["seq"] = "r"+strconv.FormatInt(c.seq, 10), op, c.fence, c.seq
	line, err := json.Marshal(req)
	if err != nil {
		return Answer{}, err
	}
	line = append(line, '\n')
	var a Answer
	for attempt := range 5 {
		if _, err := c.conn.Write(line); err != nil {
			return Answer{}, fmt.Errorf("%w: %w", ErrClosed, err)
		}
		raw, err := c.r.ReadBytes('\n')
		if err != nil {
			return Answer{}, fmt.Errorf("%w: %w", ErrClosed, err)
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return Answer{}, fmt.Errorf("ymirctl: answer %q: %w", raw, err)
		}
		switch a.Status {
		case "stale_fence":
			return a, ErrStaleFence
		case "bad_request":
			return a, fmt.Errorf("ymirctl: %s", a.Reason)
		case "unavailable", "rate_limited":
			time.Sleep(time.Duration(50<<attempt) * time.Millisecond)
			continue
		}
		return a, nil
	}
	return a, fmt.Errorf("ymirctl: %s: %s", a.Status, a.Reason)
}

// Usage reports one call's usage.
func (c *Control) Usage(u Usage) error {
	_, err := c.Request("usage", map[string]any{"model": u.Model, "tokens_in": u.TokensIn, "tokens_out": u.TokensOut,
		"cost_usd": u.CostUSD, "tool_calls": u.ToolCalls})
	return err
}

// Reserve asks for amountUSD before an expensive call: true when granted, false when
// the budget is exhausted.
func (c *Control) Reserve(amountUSD float64) (bool, error) {
	a, err := c.Request("reserve", map[string]any{"amount_usd": amountUSD})
	return a.Status == "granted", err
}

// Checkpoint saves the run's progress (a JSON object of at most 32 KiB).
func (c *Control) Checkpoint(state any) error {
	_, err := c.Request("checkpoint", map[string]any{"checkpoint": state})
	return err
}

// Permit waits until upstream (jira, gitlab, llm:<model>) may be called.
func (c *Control) Permit(ctx context.Context, upstream string) error {
	for {
		a, err := c.Request("permit", map[string]any{"upstream": upstream})
		if err != nil || a.Status == "granted" {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(max(a.RetryAfterMS, 1)) * time.Millisecond):
		}
	}
}

// Throttled reports a 429 from upstream: every worker's permits for it wait
// retryAfter, then run at half the rate for a while.
func (c *Control) Throttled(upstream string, retryAfter time.Duration) error {
	_, err := c.Request("throttled", map[string]any{"upstream": upstream, "retry_after_ms": retryAfter.Milliseconds()})
	return err
}

// Progress says the agent is making progress without a usage report or a checkpoint
// (a long tool call, a build): with PROGRESS_TIMEOUT set, a run quiet that long loses
// its lease.
func (c *Control) Progress() error {
	_, err := c.Request("progress", nil)
	return err
}
