package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const costHelp = `
Shows what the agents reported spending through their control channel (YMIR_CONTROL_FD),
counted once per report: per issue, agent and day (UTC), with the issue's total and any
budget raise. Without KEY, the 100 issues with the most recent reports.

Arguments:
  KEY...   issue keys (optional)
`

// costRow is one line of cost: an issue's spend by one agent on one day.
type costRow struct {
	Issue     string  `json:"issue"`
	Agent     string  `json:"agent"`
	Day       string  `json:"day"`
	CostUSD   float64 `json:"cost_usd"`
	TokensIn  int64   `json:"tokens_in"`
	TokensOut int64   `json:"tokens_out"`
	ToolCalls int64   `json:"tool_calls"`
	Reports   int64   `json:"reports"`
	micro     int64
}

// costReport is cost's --json output.
type costReport struct {
	Rows   []costRow        `json:"rows"`
	Issues []agentctl.Costs `json:"issues"`
}

func runCost(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Inspect
	var keys []string
	return operator{name: "cost", settings: &cfg, common: &cfg.Common,
		check: func(s *session) error {
			for _, k := range s.pos {
				c, err := lease.Canonicalize(k, lease.DefaultKeyPattern)
				if err != nil {
					return badKey(k)
				}
				keys = append(keys, c)
			}
			return nil
		},
		work: func(ctx context.Context, s *session) error { return showCost(ctx, s, &cfg, keys) },
	}.run(ctx, args, stdout, stderr)
}

func showCost(ctx context.Context, s *session, cfg *config.Inspect, keys []string) error {
	ledger, err := agentctl.NewLedger(s.rdb, s.topology.Namespace+":", agentctl.Budgets{})
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		if keys, err = ledger.Issues(ctx, 100); err != nil {
			return err
		}
	}
	rep := costReport{Rows: []costRow{}, Issues: []agentctl.Costs{}}
	for _, k := range keys {
		c, err := ledger.Costs(ctx, k)
		if err != nil {
			return err
		}
		reports, err := ledger.Reports(ctx, k)
		if err != nil {
			return err
		}
		rep.Issues = append(rep.Issues, c)
		rep.Rows = append(rep.Rows, costRows(reports)...)
	}
	if cfg.JSON {
		return writeJSON(s.stdout, rep)
	}
	if len(rep.Rows) == 0 {
		fmt.Fprintln(s.stdout, "no costs reported")
		return nil
	}
	t := newTable(s.stdout, "ISSUE", "AGENT", "DAY", "COST USD", "TOKENS IN", "TOKENS OUT", "TOOL CALLS", "REPORTS")
	for _, r := range rep.Rows {
		t.row(r.Issue, r.Agent, r.Day, usd(r.CostUSD), strconv.FormatInt(r.TokensIn, 10), strconv.FormatInt(r.TokensOut, 10),
			strconv.FormatInt(r.ToolCalls, 10), strconv.FormatInt(r.Reports, 10))
	}
	for _, c := range rep.Issues {
		day := "total"
		if c.RaisedUSD > 0 {
			day = "total (budget raised " + usd(c.RaisedUSD) + ")"
		}
		t.row(c.Issue, "*", day, usd(c.USD), strconv.FormatInt(c.TokensIn, 10), strconv.FormatInt(c.TokensOut, 10),
			strconv.FormatInt(c.ToolCalls, 10), strconv.FormatInt(c.Reports, 10))
	}
	return t.flush()
}

// costRows sums reports per (issue, agent, UTC day), in that order.
func costRows(reports []agentctl.Report) []costRow {
	by := map[[3]string]*costRow{}
	for _, r := range reports {
		k := [3]string{r.Issue, r.Agent, r.Time.UTC().Format("2006-01-02")}
		row := by[k]
		if row == nil {
			row = &costRow{Issue: k[0], Agent: k[1], Day: k[2]}
			by[k] = row
		}
		row.micro += r.Micro
		row.TokensIn += r.TokensIn
		row.TokensOut += r.TokensOut
		row.ToolCalls += r.ToolCalls
		row.Reports++
	}
	out := make([]costRow, 0, len(by))
	for _, r := range by {
		r.CostUSD = agentctl.USD(r.micro)
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Issue != b.Issue {
			return a.Issue < b.Issue
		}
		if a.Agent != b.Agent {
			return a.Agent < b.Agent
		}
		return a.Day < b.Day
	})
	return out
}

func usd(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
