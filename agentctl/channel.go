package agentctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Limits bound one run's channel.
type Limits struct {
	// Rate is the requests a second a run may send, Burst how many at once; above it a
	// request is answered rate_limited. Defaults 20 and 40.
	Rate  float64
	Burst int
	// MaxStrikes ends the channel after that many bad or rate-limited lines in a row
	// (the agent is broken or hostile). Default 50.
	MaxStrikes int
}

func (l Limits) withDefaults() Limits {
	if l.Rate <= 0 {
		l.Rate = 20
	}
	if l.Burst <= 0 {
		l.Burst = 40
	}
	if l.MaxStrikes <= 0 {
		l.MaxStrikes = 50
	}
	return l
}

// ErrChannelAbuse ends a channel whose agent sent Limits.MaxStrikes bad or
// rate-limited lines in a row.
var ErrChannelAbuse = errors.New("agent control channel: too many bad or rate-limited requests")

// Observer counts what the channels see (pipeline metrics, Prometheus). Nil: nothing.
type Observer interface {
	Usage(agent, model string, micro, tokensIn, tokensOut, toolCalls int64)
	Request(agent, op, status string)
}

// Totals is what one run reported, counted (for its span).
type Totals struct {
	Micro, TokensIn, TokensOut, ToolCalls, Reports int64
}

// Channel serves one run's control channel. Open one per run with Ledger.Open.
type Channel struct {
	ledger  *Ledger
	permits Permits
	run     Run
	limits  Limits
	obs     Observer
	log     zerolog.Logger
	now     func() time.Time

	progress time.Duration

	mu        sync.Mutex
	exhausted bool
	totals    Totals
	tokens    float64
	last      time.Time
	// lastCounted is the highest seq whose usage this process added to totals.
	lastCounted int64
	// progressAt is the run's last sign of progress: the channel's opening, a counted
	// usage report, a saved checkpoint, a progress request.
	progressAt time.Time
}

// ErrNoProgress is the cause a run's lease ends with when its agent reported no
// progress for ChannelOptions.ProgressTimeout (WatchProgress).
var ErrNoProgress = errors.New("agent control channel: no progress reported within the progress timeout")

// ChannelOptions are a channel's collaborators besides the ledger.
type ChannelOptions struct {
	Permits  Permits // nil: every permit is granted
	Limits   Limits
	Observer Observer
	Logger   zerolog.Logger
	// ProgressTimeout, when above 0, ends a run whose agent reports no progress (a
	// counted usage report, a saved checkpoint, a progress request) for that long, as
	// a wedged handler's: WatchProgress gives its lease up. Default 0: off.
	ProgressTimeout time.Duration
}

// Open returns the channel of run.
func (l *Ledger) Open(run Run, o ChannelOptions) *Channel {
	lim := o.Limits.withDefaults()
	return &Channel{ledger: l, permits: o.Permits, run: run, limits: lim, obs: o.Observer, now: time.Now,
		tokens: float64(lim.Burst), progress: o.ProgressTimeout, progressAt: time.Now(),
		log: o.Logger.With().Str("issue_key", run.Issue).Str("agent", run.Agent).Int64("fence", run.Fence).Logger()}
}

// Exhausted reports whether a reservation of the run was denied for the budget.
func (c *Channel) Exhausted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exhausted
}

// Totals is what the run reported so far, counted.
func (c *Channel) Totals() Totals {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.totals
}

// Serve answers the requests read from rw until it reaches its end, ctx ends or the
// agent abuses it. It voids the run's open reservation when it returns.
func (c *Channel) Serve(ctx context.Context, rw io.ReadWriter) error {
	defer func() {
		vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.ledger.Void(vctx, c.run); err != nil {
			c.log.Warn().Err(err).Msg("could not void the run's reservation; it ends with its lease")
		}
	}()
	br := bufio.NewReaderSize(rw, MaxLine+1)
	enc := json.NewEncoder(rw)
	strikes := 0
	for ctx.Err() == nil {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			return nil
		}
		var a Answer
		switch {
		case errors.Is(err, errLineTooLong):
			a = Answer{Status: StatusBadRequest, Reason: fmt.Sprintf("a line is at most %d bytes", MaxLine)}
		case err != nil:
			return fmt.Errorf("agent control channel: read: %w", err)
		case len(line) == 0:
			continue
		case !c.allow():
			a = Answer{Status: StatusRateLimited, Reason: fmt.Sprintf("at most %g requests a second", c.limits.Rate)}
		default:
			a = c.handle(ctx, line)
		}
		if a.Status == StatusBadRequest || a.Status == StatusRateLimited {
			if strikes++; strikes >= c.limits.MaxStrikes {
				c.log.Warn().Str("status", a.Status).Msg("agent control channel closed: too many bad or rate-limited requests")
				return ErrChannelAbuse
			}
		} else {
			strikes = 0
		}
		if err := enc.Encode(a); err != nil {
			return fmt.Errorf("agent control channel: write: %w", err)
		}
	}
	return nil
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line of at most MaxLine bytes; a longer one is skipped to its end
// and reported as errLineTooLong.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return nil, errLineTooLong
	}
	if err != nil && (!errors.Is(err, io.EOF) || len(line) == 0) {
		return nil, err
	}
	line = trimEOL(line)
	if len(line) > MaxLine {
		return nil, errLineTooLong
	}
	return line, nil
}

func trimEOL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// allow is the channel's token bucket.
func (c *Channel) allow() bool {
	now := c.now()
	if !c.last.IsZero() {
		c.tokens = min(float64(c.limits.Burst), c.tokens+now.Sub(c.last).Seconds()*c.limits.Rate)
	}
	c.last = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

func (c *Channel) handle(ctx context.Context, line []byte) Answer {
	req, err := ParseRequest(line, c.run.Fence)
	if err != nil {
		c.count(req.Op, StatusBadRequest)
		return Answer{ID: req.ID, Status: StatusBadRequest, Reason: err.Error()}
	}
	a, err := c.dispatch(ctx, req)
	if err != nil {
		c.log.Warn().Err(err).Str("op", req.Op).Msg("agent control request failed")
		a = Answer{Status: StatusUnavailable, Reason: "ymirflow could not answer; ask again"}
	}
	a.ID = req.ID
	c.count(req.Op, a.Status)
	return a
}

func (c *Channel) count(op, status string) {
	if c.obs != nil {
		c.obs.Request(c.run.Agent, op, status)
	}
}

func (c *Channel) dispatch(ctx context.Context, req Request) (Answer, error) {
	switch req.Op {
	case OpUsage:
		return c.usage(ctx, req)
	case OpReserve:
		return c.reserve(ctx, req)
	case OpCheckpoint:
		st, err := c.ledger.SaveCheckpoint(ctx, c.run, req.Seq, req.Checkpoint)
		if st == StatusSaved {
			c.progressed()
		}
		return Answer{Status: st}, err
	case OpPermit:
		return c.permit(ctx, req)
	case OpProgress:
		c.progressed()
		return Answer{Status: StatusNoted}, nil
	default: // OpThrottled
		if c.permits != nil {
			if err := c.permits.Throttle(ctx, req.Upstream, time.Duration(req.RetryAfterMS)*time.Millisecond); err != nil {
				return Answer{}, err
			}
		}
		c.log.Info().Str("upstream", req.Upstream).Int64("retry_after_ms", req.RetryAfterMS).Msg("agent reported a 429: the upstream's permits shrink for every pod")
		return Answer{Status: StatusNoted}, nil
	}
}

func (c *Channel) usage(ctx context.Context, req Request) (Answer, error) {
	u := Usage{Model: req.Model, TokensIn: req.TokensIn, TokensOut: req.TokensOut, Micro: Micro(req.CostUSD), ToolCalls: req.ToolCalls}
	st, spent, err := c.ledger.Report(ctx, c.run, req.Seq, u)
	if err != nil {
		return Answer{}, err
	}
	if st == StatusCounted {
		c.progressed()
	}
	if st == StatusCounted && c.markCounted(req.Seq) {
		c.mu.Lock()
		c.totals.Micro += u.Micro
		c.totals.TokensIn += u.TokensIn
		c.totals.TokensOut += u.TokensOut
		c.totals.ToolCalls += u.ToolCalls
		c.totals.Reports++
		c.mu.Unlock()
		if c.obs != nil {
			c.obs.Usage(c.run.Agent, u.Model, u.Micro, u.TokensIn, u.TokensOut, u.ToolCalls)
		}
	}
	if st == StatusStaleFence {
		c.log.Warn().Int64("seq", req.Seq).Msg("usage refused: the run no longer holds its lease")
	}
	return Answer{Status: st, SpentUSD: USD(spent)}, nil
}

// markCounted reports whether seq is counted for the first time in this process (a
// retried report answered "counted" again is not added to the totals twice).
func (c *Channel) markCounted(seq int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq <= c.lastCounted {
		return false
	}
	c.lastCounted = seq
	return true
}

func (c *Channel) reserve(ctx context.Context, req Request) (Answer, error) {
	g, err := c.ledger.Reserve(ctx, c.run, req.Seq, Micro(req.AmountUSD))
	if err != nil {
		return Answer{}, err
	}
	a := Answer{Status: g.Status, SpentUSD: USD(g.Spent), ReservedUSD: USD(g.Reserved), BudgetUSD: USD(g.Budget)}
	if g.Status == StatusDenied {
		a.Reason = "budget.exhausted: the " + g.Reason + "'s budget"
		c.mu.Lock()
		c.exhausted = true
		c.mu.Unlock()
		c.log.Warn().Str("budget", g.Reason).Float64("asked_usd", req.AmountUSD).Float64("spent_usd", a.SpentUSD).
			Float64("budget_usd", a.BudgetUSD).Msg("reservation denied: budget exhausted")
	}
	return a, nil
}

func (c *Channel) permit(ctx context.Context, req Request) (Answer, error) {
	if c.permits == nil {
		return Answer{Status: StatusGranted}, nil
	}
	wait, err := c.permits.Allow(ctx, req.Upstream)
	if err != nil && ctx.Err() != nil {
		// The run ended while its agent waited for its turn: nothing failed.
		return Answer{Status: StatusUnavailable, Reason: "the run is ending"}, nil
	}
	if err != nil {
		return Answer{}, err
	}
	if wait > 0 {
		return Answer{Status: StatusWait, RetryAfterMS: max(wait.Milliseconds(), 1)}, nil
	}
	return Answer{Status: StatusGranted}, nil
}

func (c *Channel) progressed() {
	c.mu.Lock()
	c.progressAt = c.now()
	c.mu.Unlock()
}

// WatchProgress gives the run's lease up (giveUp, with a cause wrapping ErrNoProgress)
// when its agent reports no progress for ChannelOptions.ProgressTimeout, and returns;
// it returns at once when that is off, and when ctx ends (the run ended). It looks
// four times a timeout.
func (c *Channel) WatchProgress(ctx context.Context, giveUp func(cause error)) {
	if c.progress <= 0 {
		return
	}
	tick := time.NewTicker(max(c.progress/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.mu.Lock()
		quiet := c.now().Sub(c.progressAt)
		c.mu.Unlock()
		if quiet >= c.progress {
			c.log.Warn().Dur("quiet", quiet).Dur("progress_timeout", c.progress).
				Msg("the agent reported no progress: its lease is given up, as a wedged handler's")
			giveUp(fmt.Errorf("%w (%s)", ErrNoProgress, c.progress))
			return
		}
	}
}
