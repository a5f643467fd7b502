package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
)

const streamsHelp = `
Shows every stream of the pipeline that exists (each agent's input stream and its
:todo twin, then results and dead): length, first and last entry id, and per consumer
group the lag (entries not yet delivered; ? when Redis cannot tell, as miniredis), the pending count,
the last delivered id, and each consumer with its pending count, idle time (? when
Redis does not say: the embedded miniredis, or a worker that has not read yet) and
state: alive (its worker renewed its presence in the last 10s, busy or idle), dead (its
worker stopped renewing: killed or cut off) or no-heartbeat (stopped cleanly, or a
worker that does not report its presence).

Cost: 2 round trips (XINFO STREAM + XINFO GROUPS of every stream pipelined, then
XINFO CONSUMERS of every group pipelined).
`

// runStreams prints the streams with their groups and consumers.
func runStreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Inspect
	return operator{name: "streams", settings: &cfg, common: &cfg.Common, inspect: true,
		work: func(ctx context.Context, s *session) error { return listStreams(ctx, s, &cfg) },
	}.run(ctx, args, stdout, stderr)
}

func listStreams(ctx context.Context, s *session, cfg *config.Inspect) error {
	stdout, stderr := s.stdout, s.stderr
	streams, err := s.in.Streams(ctx)
	if err != nil {
		return err
	}
	if streams == nil {
		streams = []inspect.StreamInfo{}
	}
	if cfg.JSON {
		return writeJSON(stdout, inspect.StreamsReport{Streams: streams})
	}
	pauseBanner(ctx, s)
	if len(streams) == 0 {
		fmt.Fprintf(stdout, "no streams under namespace %s yet\n", cfg.Namespace)
		noteFilters(stderr, &cfg.Common)
		return nil
	}
	t := newTable(stdout, "STREAM", "KIND", "LENGTH", "FIRST", "LAST", "GROUP", "LAG", "PENDING", "LAST DELIVERED", "CONSUMERS (pending, idle, state)")
	for _, s := range streams {
		head := []string{s.Stream, s.Kind, strconv.FormatInt(s.Length, 10), s.FirstID, s.LastID}
		if len(s.Groups) == 0 {
			note := ""
			if s.Kind == "input" && s.Length > 0 {
				note = inspect.NoWorker(s.Length) // nobody consumes it
			}
			t.row(append(head, "(none)", "", "", "", note)...)
			continue
		}
		for i, g := range s.Groups {
			if i > 0 {
				head = []string{"", "", "", "", ""}
			}
			lag := strconv.FormatInt(g.Lag, 10)
			if g.Lag < 0 {
				lag = "?"
			}
			var cs []string
			for _, c := range g.Consumers {
				idle := human(c.Idle)
				if c.Idle < 0 { // the embedded Redis does not say, or it has not read yet
					idle = "?"
				}
				state := c.State
				if c.Drain != "" { // ymirflow drain: alive, and taking no new work
					state += " " + c.Drain
				}
				cs = append(cs, fmt.Sprintf("%s(%d, %s, %s)", c.Name, c.Pending, idle, state))
			}
			t.row(append(head, g.Name, lag, strconv.FormatInt(g.Pending, 10), g.LastDeliveredID, strings.Join(cs, " "))...)
		}
	}
	return t.flush()
}
