package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/drainreq"
)

const drainHelp = `
Drains workers for maintenance or an upgrade: each targeted worker takes no new work
(reads no new entry, claims no one else's), gives the entries it read ahead back to
the group at once (another worker takes them: nothing is lost or waits for
MAX_IDLE_TIME), lets its running event finish, then reports "drained" in its presence
record (drain, streams, the console's workers and banner). A worker started while a
request for it stands starts drained. Workers see a request within 2 s.

  drain --agent A [--branch B] --reason WHY [--wait]   the workers of an agent (a branch)
  drain --worker NAME --reason WHY [--wait]            one worker (CONSUMER_NAME, or NAME-i)
  drain --all --reason WHY [--wait]                    every worker
  drain TARGET --undo --reason WHY                     withdraw it: the workers take work again
  drain [--json]                                       the standing requests and their workers

--wait blocks, printing progress, until every live worker the target names reports
drained (exit 1 after --timeout). Every request and undo is recorded in the audit trail
before it takes effect. Workers that stop meanwhile drop out of the count.

Cost: a write is the audit record and one HSET or HDEL; the list and each --wait poll
(every 500 ms) one round trip.
`

// runDrain asks workers to drain (or undoes it), or lists the standing requests.
func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Drain
	return operator{name: "drain", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if err := noArgs("")(s); err != nil || !cfg.Targeted() {
				return err
			}
			return cfg.NeedReason("drain")
		},
		work: func(ctx context.Context, s *session) error {
			if !cfg.Targeted() {
				return listDrains(ctx, s, &cfg)
			}
			return drain(ctx, s, &cfg)
		},
	}.run(ctx, args, stdout, stderr)
}

func drainTarget(cfg *config.Drain) drainreq.Target {
	return drainreq.Target{All: cfg.All, Agent: cfg.Agent, Branch: cfg.Branch, Worker: cfg.Worker}
}

func drain(ctx context.Context, s *session, cfg *config.Drain) error {
	t := drainTarget(cfg)
	octx := asOperator(ctx, &cfg.Writer)
	if cfg.Undo {
		if err := s.in.Undrain(octx, t); err != nil {
			return err
		}
		fmt.Fprintf(s.stdout, "drain of %s withdrawn: its workers take work again within 2s\n", t)
		return nil
	}
	if err := s.in.Drain(octx, t); err != nil {
		return err
	}
	fmt.Fprintf(s.stdout, "drain of %s requested: its workers take no new work within 2s\n", t)
	if !cfg.Wait {
		return nil
	}
	return waitDrained(ctx, s, t, cfg.Timeout)
}

// drainPoll is how often --wait looks at the workers' presence.
const drainPoll = 500 * time.Millisecond

// waitDrained polls until every live worker of t reports drained, printing a line
// whenever the count changes.
func waitDrained(ctx context.Context, s *session, t drainreq.Target, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for {
		st, err := s.in.DrainProgress(ctx, t)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil {
			line := drainLine(st)
			if line != last {
				fmt.Fprintf(s.stdout, "%s  %s\n", time.Now().Format("15:04:05"), line)
				last = line
			}
			if st.Done() {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain of %s: not every worker drained within %s (%s); the request stands", t, timeout, last)
		case <-tick.C:
		}
	}
}

// drainLine is the progress of a drain: "1/2 drained; draining: w2-0".
func drainLine(st inspect.DrainStatus) string {
	if len(st.Workers) == 0 {
		return "no live worker is named by it: nothing runs there"
	}
	var waiting []string
	for _, w := range st.Workers {
		if w.Drain != drainreq.Drained {
			waiting = append(waiting, w.Consumer+" on "+w.Stream+" ("+orDash(w.Drain)+")")
		}
	}
	line := fmt.Sprintf("%d/%d drained", st.Drained, len(st.Workers))
	if len(waiting) > 0 {
		line += "; waiting for " + strings.Join(waiting, ", ")
	}
	return line
}

// DrainReport is drain --json: the standing requests.
type DrainReport struct {
	Drains []inspect.DrainStatus `json:"drains"`
}

func listDrains(ctx context.Context, s *session, cfg *config.Drain) error {
	all, err := s.in.Drains(ctx)
	if err != nil {
		return err
	}
	if cfg.JSON {
		if all == nil {
			all = []inspect.DrainStatus{}
		}
		return writeJSON(s.stdout, DrainReport{Drains: all})
	}
	if len(all) == 0 {
		fmt.Fprintln(s.stdout, "no drain requests: every worker takes work")
		return nil
	}
	t := newTable(s.stdout, "TARGET", "SINCE", "WHO", "REASON", "DRAINED", "WORKERS")
	for _, d := range all {
		var ws []string
		for _, w := range d.Workers {
			ws = append(ws, w.Consumer+" on "+w.Stream+" "+orDash(w.Drain))
		}
		t.row(d.Request.Target.String(), stamp(d.Request.At), orDash(d.Request.Who), clip(d.Request.Reason, 60),
			fmt.Sprintf("%d/%d", d.Drained, len(d.Workers)), orDash(strings.Join(ws, ", ")))
	}
	return t.flush()
}
