package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/ymirflow/ymirflow/agentctl"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
)

const historyHelp = `
Shows every event of one issue across all the pipeline's streams, including results
and dead letters, in time order (the time of each stream id): time, stream, id, event
type, agent, fence, correlation id, and what it is about (the entry a result or dead
letter refers to) with details (outcome, lock holder, error; cut to 100 characters
in the table, whole in --json).

Cost: two round trips, whatever the streams' length: the issue's per-issue index of
every stream (a small sorted set beside each stream, written with each entry), then the
indexed entries by id. Only entries older than the index (appended before it began,
more than 30 days ago, or by a writer that does not index, such as a hand-made XADD)
are found by scanning that older part of each stream, in pages of 1000, and the output
says so.
`

// runHistory prints every event of one issue, in order.
func runHistory(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Inspect
	return operator{name: "history", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if len(s.pos) != 1 {
				return usagef("history takes one issue key, e.g. history RHEL-123 (got %q)", s.pos)
			}
			return nil
		},
		work: func(ctx context.Context, s *session) error { return showHistory(ctx, s, &cfg) },
	}.run(ctx, args, stdout, stderr)
}

func showHistory(ctx context.Context, s *session, cfg *config.Inspect) error {
	pos, stdout, stderr := s.pos, s.stdout, s.stderr
	rep, err := s.in.Timeline(ctx, pos[0])
	if err != nil {
		return inputKeyErr(err, pos[0])
	}
	events := rep.Events
	if events == nil {
		events = []inspect.HistoryEvent{}
	}
	if cfg.JSON {
		rep.Events = events
		if len(events) == 0 {
			rep.Issue = pos[0]
		}
		return writeJSON(stdout, rep)
	}
	pauseBanner(ctx, s)
	if rep.Scanned != nil {
		defer fmt.Fprintf(stdout, "note: %s\n", rep.Scanned)
	}
	if len(events) == 0 {
		fmt.Fprintf(stdout, "no events of %s in any stream\n", pos[0])
		noteFilters(stderr, &cfg.Common)
		return nil
	}
	t := newTable(stdout, "TIME", "STREAM", "ID", "EVENT", "AGENT", "FENCE", "CORRELATION ID", "REPLAY OF", "ABOUT", "DETAIL")
	for _, ev := range events {
		t.row(ev.Time.UTC().Format("2006-01-02 15:04:05.000Z"), ev.Stream, ev.ID, ev.EventType, ev.Agent, ev.Fence,
			ev.CorrelationID, ev.ReplayOf, ev.About, clip(inspect.ShortDetail(ev.Detail), 100))
	}
	if err := t.flush(); err != nil {
		return err
	}
	return historyCost(ctx, s, rep.Issue)
}

// historyCost ends the history with the issue's ledger, when its agents reported any
// usage through their control channel.
func historyCost(ctx context.Context, s *session, issue string) error {
	ledger, err := agentctl.NewLedger(s.rdb, s.topology.Namespace+":", agentctl.Budgets{})
	if err != nil {
		return err
	}
	c, err := ledger.Costs(ctx, issue)
	if err != nil || c.Reports == 0 {
		return err
	}
	agents := make([]string, 0, len(c.ByAgent))
	for a, m := range c.ByAgent {
		agents = append(agents, a+" "+usd(agentctl.USD(m)))
	}
	sort.Strings(agents)
	fmt.Fprintf(s.stdout, "cost: %s USD in %d reports (%s), %d tokens in, %d out, %d tool calls; `ymirflow cost %s` per day\n",
		usd(c.USD), c.Reports, strings.Join(agents, ", "), c.TokensIn, c.TokensOut, c.ToolCalls, issue)
	return nil
}
