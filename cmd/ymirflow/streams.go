package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/config"
)

const streamsHelp = `
Shows every stream of the pipeline that exists (each agent's input stream and its
:todo twin, then results and dead): length, first and last entry id, and per consumer
group the lag (entries not yet delivered; ? when Redis cannot tell), the pending count,
the last delivered id, and each consumer with its pending count and idle time.

Cost: 2 round trips (XINFO STREAM + XINFO GROUPS of every stream pipelined, then
XINFO CONSUMERS of every group pipelined).
`

// runStreams prints the streams with their groups and consumers.
func runStreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Inspect
	pos, err := loadCmd("streams", &cfg, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q", pos)
	}
	e, in, err := inspector(ctx, &cfg.Common, stderr)
	if err != nil {
		return err
	}
	defer e.Close()
	streams, err := in.Streams(ctx)
	if err != nil {
		return err
	}
	if streams == nil {
		streams = []inspect.StreamInfo{}
	}
	if cfg.JSON {
		return writeJSON(stdout, inspect.StreamsReport{Streams: streams})
	}
	if len(streams) == 0 {
		fmt.Fprintf(stdout, "no streams under namespace %s yet\n", cfg.Namespace)
		noteFilters(stderr, &cfg.Common)
		return nil
	}
	t := newTable(stdout, "STREAM", "KIND", "LENGTH", "FIRST", "LAST", "GROUP", "LAG", "PENDING", "LAST DELIVERED", "CONSUMERS (pending, idle)")
	for _, s := range streams {
		head := []string{s.Stream, s.Kind, strconv.FormatInt(s.Length, 10), s.FirstID, s.LastID}
		if len(s.Groups) == 0 {
			t.row(append(head, "", "", "", "", "")...)
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
				cs = append(cs, fmt.Sprintf("%s(%d, %s)", c.Name, c.Pending, human(c.Idle)))
			}
			t.row(append(head, g.Name, lag, strconv.FormatInt(g.Pending, 10), g.LastDeliveredID, strings.Join(cs, " "))...)
		}
	}
	return t.flush()
}
