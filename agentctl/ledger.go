package agentctl

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

var (
	//go:embed scripts/common.lua
	commonLua string
	//go:embed scripts/reserve.lua
	reserveLua string
	//go:embed scripts/usage.lua
	usageLua string
	//go:embed scripts/checkpoint.lua
	checkpointLua string
	//go:embed scripts/void.lua
	voidLua string
	//go:embed scripts/raise.lua
	raiseLua string
	//go:embed scripts/forget.lua
	forgetLua string
	//go:embed scripts/ask.lua
	askLua string
)

// DefaultUsageMaxLen bounds each issue's usage stream (approximately, MAXLEN ~).
const DefaultUsageMaxLen = 10_000

// Budgets are the spend limits, in USD; 0 is no limit (the default: off until set).
type Budgets struct {
	Issue float64 // every run of every agent of one issue
	Agent float64 // every run of one agent of one issue
}

// Run names one run: its issue and agent, and its lease as Redis holds it (the lease's
// lock and info keys, its token and fence), against which every request is checked.
type Run struct {
	Issue, Agent string
	Fence        int64
	Token        string
	LockKey      string
	InfoKey      string
}

func (r Run) field() string { return r.Agent + "|" + strconv.FormatInt(r.Fence, 10) }

// Usage is one usage report.
type Usage struct {
	Model     string
	TokensIn  int64
	TokensOut int64
	Micro     int64 // cost, micro-USD
	ToolCalls int64
}

// Grant is a reservation's answer, with the issue's figures after it.
type Grant struct {
	Status   string // StatusGranted, StatusDenied, StatusStaleFence, StatusStaleSeq
	Reason   string // "issue" or "agent" when denied
	Spent    int64  // micro-USD
	Reserved int64
	Budget   int64 // effective, raises included; 0 no budget
}

// Ledger is the per-issue ledger of spend, reservations and checkpoints in Redis.
type Ledger struct {
	rdb     redis.UniversalClient
	prefix  string
	budgets Budgets
	maxLen  int64
	now     func() time.Time

	reserve, usage, checkpoint, void, raise, forget, ask *redis.Script
}

// NewLedger returns the ledger under prefix (the topology's namespace and a colon,
// e.g. "ymir:"), with budgets.
func NewLedger(rdb redis.UniversalClient, prefix string, budgets Budgets) (*Ledger, error) {
	if rdb == nil {
		return nil, errors.New("agentctl: no Redis client")
	}
	if budgets.Issue < 0 || budgets.Agent < 0 {
		return nil, errors.New("agentctl: a budget must be 0 (off) or more")
	}
	return &Ledger{rdb: rdb, prefix: prefix, budgets: budgets, maxLen: DefaultUsageMaxLen, now: time.Now,
		reserve: redis.NewScript(commonLua + reserveLua), usage: redis.NewScript(commonLua + usageLua),
		checkpoint: redis.NewScript(commonLua + checkpointLua), void: redis.NewScript(voidLua), raise: redis.NewScript(raiseLua),
		forget: redis.NewScript(forgetLua), ask: redis.NewScript(askLua)}, nil
}

// Budgets are the ledger's limits.
func (l *Ledger) Budgets() Budgets { return l.budgets }

// keys of one issue's ledger: all under ctl:{<ISSUE>}, one hash slot.
func (l *Ledger) key(issue, part string) string { return l.prefix + "ctl:{" + issue + "}:" + part }

func (l *Ledger) indexKey() string { return l.prefix + "ctl:issues" }

// UsageStream is the name of issue's usage stream (one entry per counted report).
func (l *Ledger) UsageStream(issue string) string { return l.key(issue, "usage") }

// Reserve asks for micro-USD for run's next call (seq: the request's).
func (l *Ledger) Reserve(ctx context.Context, run Run, seq, micro int64) (Grant, error) {
	keys := []string{run.LockKey, run.InfoKey, l.key(run.Issue, "ledger"), l.key(run.Issue, "res"), l.key(run.Issue, "runs")}
	res, err := l.reserve.Run(ctx, l.rdb, keys, run.Token, run.Fence, run.Agent, seq, micro,
		Micro(l.budgets.Issue), Micro(l.budgets.Agent)).Slice()
	if err != nil {
		return Grant{}, fmt.Errorf("agentctl: reserve for %s of %s: %w", run.Agent, run.Issue, err)
	}
	g := Grant{Status: res[0].(string), Spent: res[1].(int64), Reserved: res[2].(int64), Budget: res[3].(int64)}
	if reason, ok := strings.CutPrefix(g.Status, "denied_"); ok {
		g.Status, g.Reason = StatusDenied, reason
	}
	return g, nil
}

// Report counts run's usage report seq once; it settles the run's open reservation.
// It returns the status and the issue's spend after it.
func (l *Ledger) Report(ctx context.Context, run Run, seq int64, u Usage) (string, int64, error) {
	keys := []string{run.LockKey, run.InfoKey, l.key(run.Issue, "ledger"), l.key(run.Issue, "res"), l.key(run.Issue, "runs"),
		l.UsageStream(run.Issue), l.indexKey()}
	res, err := l.usage.Run(ctx, l.rdb, keys, run.Token, run.Fence, run.Agent, seq, u.Micro, u.TokensIn, u.TokensOut,
		u.ToolCalls, u.Model, l.now().UnixMilli(), run.Issue, l.maxLen).Slice()
	if err != nil {
		return "", 0, fmt.Errorf("agentctl: usage for %s of %s: %w", run.Agent, run.Issue, err)
	}
	return res[0].(string), res[1].(int64), nil
}

// SaveCheckpoint saves data (a JSON object) as the checkpoint of run's agent and issue.
func (l *Ledger) SaveCheckpoint(ctx context.Context, run Run, seq int64, data []byte) (string, error) {
	keys := []string{run.LockKey, run.InfoKey, l.key(run.Issue, "ckpt:"+run.Agent), l.key(run.Issue, "runs")}
	st, err := l.checkpoint.Run(ctx, l.rdb, keys, run.Token, run.Fence, run.Agent, seq, data, l.now().UnixMilli()).Text()
	if err != nil {
		return "", fmt.Errorf("agentctl: checkpoint for %s of %s: %w", run.Agent, run.Issue, err)
	}
	return st, nil
}

// Checkpoint is a saved checkpoint: its JSON and the fence that saved it.
type Checkpoint struct {
	Data  []byte
	Fence int64
	At    time.Time
}

// LastCheckpoint returns the last checkpoint of agent on issue; ok false when none.
func (l *Ledger) LastCheckpoint(ctx context.Context, agent, issue string) (Checkpoint, bool, error) {
	h, err := l.rdb.HGetAll(ctx, l.key(issue, "ckpt:"+agent)).Result()
	if err != nil {
		return Checkpoint{}, false, fmt.Errorf("agentctl: read the checkpoint of %s of %s: %w", agent, issue, err)
	}
	if h["data"] == "" {
		return Checkpoint{}, false, nil
	}
	f, _ := strconv.ParseInt(h["fence"], 10, 64)
	at, _ := strconv.ParseInt(h["at"], 10, 64)
	return Checkpoint{Data: []byte(h["data"]), Fence: f, At: time.UnixMilli(at)}, true, nil
}

// Void ends run's open reservation (the run ended).
func (l *Ledger) Void(ctx context.Context, run Run) error {
	if err := l.void.Run(ctx, l.rdb, []string{l.key(run.Issue, "res")}, run.field()).Err(); err != nil {
		return fmt.Errorf("agentctl: void the reservation of %s of %s: %w", run.Agent, run.Issue, err)
	}
	return nil
}

// Raise adds usd to issue's budget and to each of its agents' (a maintainer's
// approval) and returns the raise in total. once names the approval (e.g. the Jira
// comment's id): a repeat adds nothing.
func (l *Ledger) Raise(ctx context.Context, issue string, usd float64, once string) (float64, error) {
	if usd <= 0 || usd > MaxCostUSD || once == "" {
		return 0, fmt.Errorf("agentctl: a raise must be above 0 and at most %d USD, and named", MaxCostUSD)
	}
	total, err := l.raise.Run(ctx, l.rdb, []string{l.key(issue, "ledger")}, once, Micro(usd)).Int64()
	if err != nil {
		return 0, fmt.Errorf("agentctl: raise the budget of %s: %w", issue, err)
	}
	return USD(total), nil
}

// RunOf names the run holding le.
func RunOf(le *lease.Lease) Run {
	k := le.Keys()
	return Run{Issue: le.Issue(), Agent: le.Agent(), Fence: le.Fence(), Token: le.Token(), LockKey: k.Lock, InfoKey: k.Info}
}

// Costs is an issue's ledger: what was reported, counted once each.
type Costs struct {
	Issue     string           `json:"issue"`
	Micro     int64            `json:"-"`
	USD       float64          `json:"cost_usd"`
	ByAgent   map[string]int64 `json:"-"`
	TokensIn  int64            `json:"tokens_in"`
	TokensOut int64            `json:"tokens_out"`
	ToolCalls int64            `json:"tool_calls"`
	Reports   int64            `json:"reports"`
	RaisedUSD float64          `json:"budget_raised_usd"`
}

// Costs reads issue's ledger.
func (l *Ledger) Costs(ctx context.Context, issue string) (Costs, error) {
	h, err := l.rdb.HGetAll(ctx, l.key(issue, "ledger")).Result()
	if err != nil {
		return Costs{}, fmt.Errorf("agentctl: read the ledger of %s: %w", issue, err)
	}
	n := func(k string) int64 { v, _ := strconv.ParseInt(h[k], 10, 64); return v }
	c := Costs{Issue: issue, Micro: n("spent"), TokensIn: n("tokens_in"), TokensOut: n("tokens_out"), ToolCalls: n("tool_calls"),
		Reports: n("reports"), RaisedUSD: USD(n("raised")), ByAgent: map[string]int64{}}
	c.USD = USD(c.Micro)
	for k := range h {
		if agent, ok := strings.CutPrefix(k, "spent:"); ok {
			c.ByAgent[agent] = n(k)
		}
	}
	return c, nil
}
