package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const pauseHelp = `
pause SCOPE --reason WHY stops new runs in SCOPE until resume SCOPE: an agent
(agent:rebase), an agent on a branch (agent:rebase/c9s), an issue (issue:RHEL-7), or
the events whose field has a value (field:metadata.component=kernel; m:NAME for a
metadata value). Its events are not run, dropped or dead-lettered: each waits, acked,
in the pause's line, and resume appends them to their streams again in stream order,
once each. Runs under way finish, and are listed; with --stop-running they are
stopped (leases force-released) and their events wait too. pause --list lists the
active pauses with the events waiting in each. Both writes are audited.

Cost: pause 1 round trip, then the live leases as locks lists them; resume 2 round
trips per waiting event; pause --list 2 round trips.
`

const resumeHelp = `
resume SCOPE --reason WHY ends the pause of SCOPE (as pause named it): its waiting
events are appended to their streams again, in stream order, each once, then new
runs start in the scope again. A resume cut short (Redis lost) is safe to repeat.
`

func runPause(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Pause
	return operator{name: "pause", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if cfg.List {
				if len(s.pos) > 0 {
					return usagef("pause --list takes no SCOPE (got %q)", s.pos)
				}
				return nil
			}
			if len(s.pos) != 1 {
				return usagef("pause takes one SCOPE, e.g. pause agent:rebase --reason WHY (got %q)", s.pos)
			}
			return cfg.NeedReason("pause")
		},
		work: func(ctx context.Context, s *session) error {
			if cfg.List {
				return listPauses(ctx, s, &cfg)
			}
			return pauseScope(asOperator(ctx, &cfg.Writer), s, &cfg, s.pos[0])
		},
	}.run(ctx, args, stdout, stderr)
}

func runResume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Pause
	return operator{name: "resume", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if len(s.pos) != 1 {
				return usagef("resume takes one SCOPE, e.g. resume agent:rebase --reason WHY (got %q)", s.pos)
			}
			if cfg.StopRunning || cfg.List {
				return usagef("resume takes neither --stop-running nor --list")
			}
			return cfg.NeedReason("resume")
		},
		work: func(ctx context.Context, s *session) error {
			r, err := s.in.Resume(asOperator(ctx, &cfg.Writer), s.pos[0])
			if errors.Is(err, lease.ErrBadPauseScope) {
				return usagef("%v", err)
			}
			if err != nil {
				return err
			}
			if cfg.JSON {
				return writeJSON(s.stdout, r)
			}
			switch {
			case !r.Found:
				fmt.Fprintf(s.stdout, "%s was not paused; nothing done\n", r.Scope)
			case r.Again:
				fmt.Fprintf(s.stdout, "%s: %d events appended again, then it was paused again meanwhile; the pause stays\n", r.Scope, r.Published)
			default:
				fmt.Fprintf(s.stdout, "resumed %s: %d waiting events appended to their streams again, in order\n", r.Scope, r.Published)
			}
			return nil
		},
	}.run(ctx, args, stdout, stderr)
}

func pauseScope(ctx context.Context, s *session, cfg *config.Pause, raw string) error {
	p, err := s.in.Pause(ctx, raw, cfg.StopRunning)
	if err != nil {
		if errors.Is(err, lease.ErrBadPauseScope) {
			return usagef("%v", err)
		}
		return err
	}
	if cfg.JSON {
		return writeJSON(s.stdout, p)
	}
	verb := "paused"
	if !p.New {
		verb = "paused again (already paused)"
	}
	fmt.Fprintf(s.stdout, "%s %s: no new run starts in it; its events wait in order until resume %s\n", verb, p.Pause.Scope, p.Pause.Scope)
	what := "running, finishes:"
	if cfg.StopRunning {
		what = "stopped, waits:"
	}
	for _, l := range p.Running {
		fmt.Fprintf(s.stdout, "  %s %s %s (fence %d, entry %s)\n", what, l.Agent, l.Issue, l.Fence, orDash(l.MessageID))
	}
	if len(p.Running) > 0 && !cfg.StopRunning {
		fmt.Fprintln(s.stdout, "  (--stop-running stops the runs under way; their events then wait too)")
	}
	return nil
}

func listPauses(ctx context.Context, s *session, cfg *config.Pause) error {
	ps, err := s.in.Pauses(ctx)
	if err != nil {
		return err
	}
	if cfg.JSON {
		if ps == nil {
			ps = []lease.Pause{}
		}
		return writeJSON(s.stdout, inspect.PauseList{Pauses: ps})
	}
	if len(ps) == 0 {
		fmt.Fprintln(s.stdout, "no active pauses")
		return nil
	}
	t := newTable(s.stdout, "SCOPE", "STATE", "WAITING", "OLDEST", "SINCE", "BY", "STOP RUNNING", "REASON")
	for _, p := range ps {
		oldest := "-"
		if !p.OldestAt.IsZero() {
			oldest = human(time.Since(p.OldestAt))
		}
		t.row(p.Scope, p.State, strconv.FormatInt(p.Waiting, 10), oldest, stamp(p.At), p.By, strconv.FormatBool(p.StopRunning), p.Reason)
	}
	return t.flush()
}

// pauseBanner prints the active pauses above a view of work (locks, pending, streams,
// history), so that nobody wonders why work does not move. A failure to read them is
// the view's own business: it says nothing.
func pauseBanner(ctx context.Context, s *session) {
	ps, err := s.in.Pauses(ctx)
	if err != nil {
		return
	}
	for _, p := range ps {
		fmt.Fprintf(s.stdout, "PAUSED %s (%s, %d waiting) since %s by %s: %s\n", p.Scope, p.State, p.Waiting, stamp(p.At), p.By, p.Reason)
	}
}
