package agentctl

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Report is one counted usage report, as the issue's usage stream holds it.
type Report struct {
	Time      time.Time `json:"time"`
	Issue     string    `json:"issue"`
	Agent     string    `json:"agent"`
	Fence     int64     `json:"fence"`
	Seq       int64     `json:"seq"`
	Model     string    `json:"model"`
	Micro     int64     `json:"-"`
	CostUSD   float64   `json:"cost_usd"`
	TokensIn  int64     `json:"tokens_in"`
	TokensOut int64     `json:"tokens_out"`
	ToolCalls int64     `json:"tool_calls"`
}

// Issues lists the issues with a counted report, most recent first (at most n; 0: all).
func (l *Ledger) Issues(ctx context.Context, n int64) ([]string, error) {
	out, err := l.rdb.ZRevRange(ctx, l.indexKey(), 0, n-1).Result()
	if err != nil {
		return nil, fmt.Errorf("agentctl: list the issues with costs: %w", err)
	}
	return out, nil
}

// Reports reads issue's counted reports, oldest first (the stream keeps the last
// DefaultUsageMaxLen or so; Costs has the totals of every one).
func (l *Ledger) Reports(ctx context.Context, issue string) ([]Report, error) {
	msgs, err := l.rdb.XRange(ctx, l.UsageStream(issue), "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("agentctl: read the usage of %s: %w", issue, err)
	}
	out := make([]Report, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, reportOf(issue, m))
	}
	return out, nil
}

func reportOf(issue string, m redis.XMessage) Report {
	s := func(k string) string { v, _ := m.Values[k].(string); return v }
	n := func(k string) int64 { v, _ := strconv.ParseInt(s(k), 10, 64); return v }
	ms, _ := strconv.ParseInt(m.ID[:max(0, indexDash(m.ID))], 10, 64)
	r := Report{Time: time.UnixMilli(ms).UTC(), Issue: issue, Agent: s("agent"), Fence: n("fence"), Seq: n("seq"), Model: s("model"),
		Micro: n("micro"), TokensIn: n("tokens_in"), TokensOut: n("tokens_out"), ToolCalls: n("tool_calls")}
	r.CostUSD = USD(r.Micro)
	return r
}

func indexDash(id string) int {
	for i := range len(id) {
		if id[i] == '-' {
			return i
		}
	}
	return len(id)
}
