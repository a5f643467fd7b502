package main

import (
	"context"
	"fmt"
	"io"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
)

const historyHelp = `
Shows every event of one issue across all the pipeline's streams, including results
and dead letters, in time order (the time of each stream id): time, stream, id, event
type, agent, fence, correlation id, and what it is about (the entry a result or dead
letter refers to) with details (outcome, lock holder, error; cut to 100 characters
in the table, whole in --json).

Cost: every stream is read whole with XRANGE in pages of 1000 entries, the next pages
of all streams pipelined together (one round trip per 1000 entries of the longest
stream), and the issue is matched here, on the client: the whole pipeline's entries
cross the network. Streams are capped by MAX_LEN, which bounds it.
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
	events, err := s.in.History(ctx, pos[0])
	if err != nil {
		return inputKeyErr(err, pos[0])
	}
	if events == nil {
		events = []inspect.HistoryEvent{}
	}
	if cfg.JSON {
		issue := pos[0]
		if len(events) > 0 {
			issue = events[0].Issue
		}
		return writeJSON(stdout, inspect.HistoryReport{Issue: issue, Events: events})
	}
	if len(events) == 0 {
		fmt.Fprintf(stdout, "no events of %s in any stream\n", pos[0])
		noteFilters(stderr, &cfg.Common)
		return nil
	}
	t := newTable(stdout, "TIME", "STREAM", "ID", "EVENT", "AGENT", "FENCE", "CORRELATION ID", "REPLAY OF", "ABOUT", "DETAIL")
	for _, ev := range events {
		t.row(ev.Time.UTC().Format("2006-01-02 15:04:05.000Z"), ev.Stream, ev.ID, ev.EventType, ev.Agent, ev.Fence,
			ev.CorrelationID, ev.ReplayOf, ev.About, clip(ev.Detail, 100))
	}
	return t.flush()
}
