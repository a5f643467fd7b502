package agentctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
)

// Ops an agent may send.
const (
	OpUsage      = "usage"
	OpReserve    = "reserve"
	OpCheckpoint = "checkpoint"
	OpPermit     = "permit"
	OpThrottled  = "throttled"
	OpProgress   = "progress"
)

// Answers (Answer.Status).
const (
	StatusCounted     = "counted"      // usage: counted (or counted before: a retry)
	StatusGranted     = "granted"      // reserve, permit
	StatusDenied      = "denied"       // reserve: the budget is exhausted (Reason says whose)
	StatusSaved       = "saved"        // checkpoint
	StatusNoted       = "noted"        // throttled, progress
	StatusWait        = "wait"         // permit: not now; ask again after RetryAfterMS
	StatusStaleFence  = "stale_fence"  // the run no longer holds its lease: stop
	StatusStaleSeq    = "stale_seq"    // seq is lower than the run's last one
	StatusBadRequest  = "bad_request"  // the request is invalid (Reason says why)
	StatusRateLimited = "rate_limited" // too many requests on the channel
	StatusUnavailable = "unavailable"  // ymirflow could not answer (Redis): ask again
)

// Bounds of a request.
const (
	// MaxLine bounds one request line, checkpoint included.
	MaxLine = 64 << 10
	// MaxCheckpoint bounds a checkpoint's JSON.
	MaxCheckpoint = 32 << 10
	// MaxCostUSD bounds one usage report's or reservation's amount.
	MaxCostUSD = 10_000
	maxTokens  = 1 << 40
	maxTools   = 1 << 20
	maxID      = 64
)

// The shapes of a model name, an upstream and a request id. The lengths are checked
// apart from the patterns: a counted repetition ({0,99}) compiles into as many copies
// of its class, which every command paid for at start (≈ 1.5 ms, 3 000 allocations);
// the patterns themselves are compiled on first use, not at start-up.
var (
	modelChars = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]*$`) })
	idChars    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:-]+$`) })
)

// validModel: a letter or digit, then letters, digits and ._:/@-, 100 at most.
func validModel(s string) bool { return len(s) <= 100 && modelChars().MatchString(s) }

// validUpstream: jira, gitlab or llm:<model>.
func validUpstream(s string) bool {
	m, llm := strings.CutPrefix(s, "llm:")
	return s == "jira" || s == "gitlab" || llm && validModel(m)
}

// validID: 1 to 64 letters, digits and ._:-.
func validID(s string) bool { return len(s) <= maxID && idChars().MatchString(s) }

// ErrBadRequest is an invalid request: its text says which field and why.
var ErrBadRequest = errors.New("bad request")

// Request is one line an agent writes. Fence is the run's YMIR_FENCE; Seq grows with
// every request of the run (a retry repeats it, and gets the first answer again).
type Request struct {
	ID    string `json:"id"`
	Op    string `json:"op"`
	Fence int64  `json:"fence"`
	Seq   int64  `json:"seq"`

	// usage
	Model     string  `json:"model,omitempty"`
	TokensIn  int64   `json:"tokens_in,omitempty"`
	TokensOut int64   `json:"tokens_out,omitempty"`
	CostUSD   float64 `json:"cost_usd,omitempty"`
	ToolCalls int64   `json:"tool_calls,omitempty"`
	// reserve
	AmountUSD float64 `json:"amount_usd,omitempty"`
	// permit, throttled
	Upstream     string `json:"upstream,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	// checkpoint
	Checkpoint json.RawMessage `json:"checkpoint,omitempty"`
}

// Answer is one line ymirflow writes back, with the request's ID.
type Answer struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// SpentUSD, ReservedUSD and BudgetUSD are the issue's, after the request (usage,
	// reserve); BudgetUSD 0: no budget.
	SpentUSD     float64 `json:"spent_usd,omitempty"`
	ReservedUSD  float64 `json:"reserved_usd,omitempty"`
	BudgetUSD    float64 `json:"budget_usd,omitempty"`
	RetryAfterMS int64   `json:"retry_after_ms,omitempty"`
}

// ParseRequest decodes and validates one line for the run of fence.
func ParseRequest(line []byte, fence int64) (Request, error) {
	var r Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Request{}, fmt.Errorf("%w: not a request object: %w", ErrBadRequest, err)
	}
	if !validID(r.ID) {
		return r, fmt.Errorf("%w: \"id\" must be 1 to %d of [A-Za-z0-9._:-]", ErrBadRequest, maxID)
	}
	if r.Fence != fence {
		return r, fmt.Errorf("%w: \"fence\" %d is not this run's (%d)", ErrBadRequest, r.Fence, fence)
	}
	if r.Seq < 1 {
		return r, fmt.Errorf("%w: \"seq\" must be at least 1", ErrBadRequest)
	}
	return r, r.validateOp()
}

func (r Request) validateOp() error {
	switch r.Op {
	case OpUsage:
		if !validModel(r.Model) {
			return fmt.Errorf("%w: \"model\" must be 1 to 100 of [A-Za-z0-9._:/@-]", ErrBadRequest)
		}
		if r.TokensIn < 0 || r.TokensIn > maxTokens || r.TokensOut < 0 || r.TokensOut > maxTokens {
			return fmt.Errorf("%w: \"tokens_in\" and \"tokens_out\" must be 0 to %d", ErrBadRequest, int64(maxTokens))
		}
		if r.ToolCalls < 0 || r.ToolCalls > maxTools {
			return fmt.Errorf("%w: \"tool_calls\" must be 0 to %d", ErrBadRequest, maxTools)
		}
		return checkUSD("cost_usd", r.CostUSD, true)
	case OpReserve:
		return checkUSD("amount_usd", r.AmountUSD, false)
	case OpCheckpoint:
		if len(r.Checkpoint) == 0 || len(r.Checkpoint) > MaxCheckpoint || bytes.TrimSpace(r.Checkpoint)[0] != '{' {
			return fmt.Errorf("%w: \"checkpoint\" must be a JSON object of at most %d bytes", ErrBadRequest, MaxCheckpoint)
		}
		return nil
	case OpPermit, OpThrottled:
		if !validUpstream(r.Upstream) {
			return fmt.Errorf("%w: \"upstream\" must be jira, gitlab or llm:<model>", ErrBadRequest)
		}
		if r.RetryAfterMS < 0 || r.RetryAfterMS > 3_600_000 {
			return fmt.Errorf("%w: \"retry_after_ms\" must be 0 to 3600000", ErrBadRequest)
		}
		return nil
	case OpProgress:
		return nil
	default:
		return fmt.Errorf("%w: unknown \"op\" %q (want usage, reserve, checkpoint, permit, throttled or progress)", ErrBadRequest, clip(r.Op, 32))
	}
}

func checkUSD(name string, v float64, zeroOK bool) error {
	if math.IsNaN(v) || v < 0 || v > MaxCostUSD || (!zeroOK && v == 0) {
		return fmt.Errorf("%w: %q must be a number of USD above 0 and at most %d", ErrBadRequest, name, MaxCostUSD)
	}
	return nil
}

// Micro converts USD to the ledger's unit, micro-USD (integers: no float drift in sums).
func Micro(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// USD converts micro-USD back.
func USD(micro int64) float64 { return float64(micro) / 1e6 }

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
