package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
)

const replayHelp = `
Re-publishes past events of one input stream as new entries at its end, through the
normal path: workers take them like any event, so the lease applies (a replay of an
issue that is locked is dropped or coalesced). Each replay gets a new id, a new UUID
and a new correlation id; replay_of holds the original stream id and causation_id the
original UUID. The range is inclusive; --to + stops at the last entry present when the
replay starts, so replays are never replayed again. Undecodable entries are skipped
and listed. --dry-run lists what would be replayed.

Replaying a whole stream (no --from, --to or --issue) asks y/N unless --yes; without a
terminal and without --yes it refuses (exit 2).

Cost: 1 round trip for the last id, 1 per 1000 entries read (the range is filtered
on the client for --issue), 1 per event replayed.
`

// runReplay re-publishes past events.
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Replay
	var route event.Route
	return operator{name: "replay", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if err := noArgs("the stream goes in --stream")(s); err != nil {
				return err
			}
			var err error
			route, err = inspect.ResolveStream(event.Topology{Namespace: cfg.Namespace}, cfg.Stream)
			if err != nil {
				return usagef("--stream: %v", err)
			}
			if cfg.DryRun {
				return nil
			}
			return cfg.NeedReason("replay (or --dry-run)")
		},
		work: func(ctx context.Context, s *session) error {
			return replay(asOperator(ctx, &cfg.Writer), s, &cfg, route)
		},
	}.run(ctx, args, stdout, stderr)
}

// replay re-publishes the events of route that cfg selects.
func replay(ctx context.Context, s *session, cfg *config.Replay, route event.Route) error {
	e, in, stdout, stderr := s.env, s.in, s.stdout, s.stderr
	whole := (cfg.From == "" || cfg.From == "-") && (cfg.To == "" || cfg.To == "+") && cfg.Issue == ""
	if whole && !cfg.DryRun {
		n, err := e.rdb.XLen(ctx, route.Stream).Result()
		if err != nil {
			return err
		}
		if err := confirm(stderr, cfg.Yes, fmt.Sprintf("replay all %d events of %s?", n, route.Stream)); err != nil {
			return err
		}
	}
	tp, stopTracing, err := startTracing(ctx, &cfg.Tracing, "replay", e.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	rep, err := in.Replay(ctx, inspect.ReplayOptions{Stream: route.Stream, From: cfg.From, To: cfg.To, Issue: cfg.Issue, DryRun: cfg.DryRun,
		TracerProvider: tp})
	if err != nil && len(rep.Events) == 0 {
		return inputKeyErr(err, cfg.Issue)
	}
	if cfg.JSON {
		if jerr := writeJSON(stdout, rep); jerr != nil {
			return jerr
		}
		return err
	}
	if len(rep.Events) > 0 {
		t := newTable(stdout, "REPLAY OF", "NEW ID", "ISSUE", "EVENT", "CORRELATION ID")
		for _, ev := range rep.Events {
			newID := ev.ID
			if rep.DryRun {
				newID = "(dry run)"
			}
			t.row(ev.ReplayOf, newID, ev.Issue, ev.EventType, ev.CorrelationID)
		}
		if ferr := t.flush(); ferr != nil {
			return ferr
		}
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(stdout, "skipped %s: %s\n", s.ID, s.Reason)
	}
	if len(rep.Events) == 0 {
		noteFilters(stderr, &cfg.Common, "stream", cfg.Stream, "from", strings.Trim(cfg.From, "-"), "to", strings.Trim(cfg.To, "+"), "issue", cfg.Issue)
	}
	verb := "replayed"
	if rep.DryRun {
		verb = "would replay"
	}
	fmt.Fprintf(stdout, "%s %d event(s) of %s", verb, len(rep.Events), rep.Stream)
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(stdout, ", skipped %d", len(rep.Skipped))
	}
	fmt.Fprintln(stdout)
	if err != nil {
		return errors.Join(fmt.Errorf("stopped after %d replays", len(rep.Events)), err)
	}
	return nil
}
