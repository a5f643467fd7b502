package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
)

const locksHelp = `
Lists the live per-issue leases: agent, issue, scope and key (agent: the agent's own
lease on the issue; issue or group: a shared key of LOCK_SCOPE, held by that agent's
run on that issue), holder (owner), fence, how long it has been held, TTL left, its
mailbox depth (follow-ups waiting, ON_CONFLICT=deliver), its line (events waiting for
the key, ON_CONFLICT=wait: "3 waiting, oldest 40s"; a key handed to the line's head
whose copy has not started yet shows the owner "(line's head)"), and the stream entry
it guards. Before them, the concurrency limit keys in use (RUN_LIMITS): slots used of
the limit and events waiting for one ("2/2 used, 5 waiting (1 priority), oldest 40s").

  locks release AGENT KEY --reason WHY [--yes]
      force-releases the lease of KEY for AGENT whoever holds it, and bumps its fence:
      the evicted holder's fenced writes are refused, its worker is told at once and
      cancels the run within a second (at its next heartbeat, LOCK_TTL/3, if it missed
      the announcement), and the entry runs again right after (about a second later)
      under a new lease, on the same worker or another: release a lease to rerun its
      entry, not to stop it (dlq and ON_CONFLICT are for that). Asks y/N on
      the terminal unless --yes; without a terminal and
      without --yes it refuses (exit 2).

Cost: with --issue, direct lookups of that issue's lease for each agent and of its
shared issue key, 1 round trip each.
Without, SCAN MATCH of the lease-record pattern (lockinfo:<scope><agent>:*): SCAN
walks the whole keyspace of the database (the MATCH filter runs on the server), one
round trip per 1000 keys, then 1 round trip per 500 leases found. Leases taken by
the Python agents (plain lock keys, no record) are found only with --issue.
Without --issue, the limit keys too: SCAN MATCH lockslotmeta:{<scope>*, then 1 round
trip per key.
locks release: 2 round trips.
`

// runLocks lists live leases, or force-releases one (locks release AGENT KEY).
func runLocks(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Locks
	return operator{name: "locks", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if err := checkLocksArgs(s); err != nil || len(s.pos) == 0 {
				return err
			}
			return cfg.NeedReason("locks release")
		},
		work: func(ctx context.Context, s *session) error {
			if len(s.pos) > 0 {
				return releaseLock(asOperator(ctx, &cfg.Writer), s, &cfg, s.pos[1], s.pos[2])
			}
			return listLocks(ctx, s, &cfg)
		},
	}.run(ctx, args, stdout, stderr)
}

// checkLocksArgs takes no positional arguments, or release AGENT KEY.
func checkLocksArgs(s *session) error {
	pos := s.pos
	if len(pos) > 0 && pos[0] == "release" {
		pos = pos[1:]
		if len(pos) != 2 {
			return usagef("locks release takes AGENT and KEY, e.g. locks release triage RHEL-123 (got %q)", pos)
		}
		if agent := pos[0]; !slices.Contains(event.Agents, agent) {
			return usagef("unknown agent %q: one of %v", agent, event.Agents)
		}
		return nil
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q (locks [--agent A] [--issue KEY] or locks release AGENT KEY)", pos)
	}
	return nil
}

func listLocks(ctx context.Context, s *session, cfg *config.Locks) error {
	stdout, stderr := s.stdout, s.stderr
	leases, err := s.in.Locks(ctx, inspect.LockFilter{Agent: cfg.Agent, Issue: cfg.Issue})
	if err != nil {
		return inputKeyErr(err, cfg.Issue)
	}
	if leases == nil {
		leases = []inspect.LeaseInfo{}
	}
	var slots []inspect.SlotInfo
	if cfg.Issue == "" {
		if slots, err = s.in.Slots(ctx); err != nil {
			return err
		}
	}
	pauses, err := s.in.Pauses(ctx)
	if err != nil {
		return err
	}
	if cfg.JSON {
		return writeJSON(stdout, inspect.LocksReport{Leases: leases, Slots: slots, Pauses: pauses})
	}
	pauseBanner(ctx, s)
	if err := listSlots(stdout, slots); err != nil {
		return err
	}
	if len(leases) == 0 {
		fmt.Fprintln(stdout, "no live leases")
		noteFilters(stderr, &cfg.Common, "agent", cfg.Agent, "issue", cfg.Issue)
		return nil
	}
	t := newTable(stdout, "AGENT", "ISSUE", "SCOPE", "KEY", "OWNER", "FENCE", "HELD FOR", "SINCE", "TTL", "MAILBOX", "LINE", "MESSAGE ID")
	for _, l := range leases {
		owner, held := l.Owner, human(l.Held)
		if owner == "" {
			owner, held = "(plain lock)", ""
		}
		entry := l.MessageID
		if l.Supersedes != "" {
			entry += " (supersedes " + l.Supersedes + ")"
		}
		if l.Reserved {
			owner, entry = "(line's head)", l.MessageID+" (its copy has not started yet)"
		}
		line := l.Line(time.Now())
		if line == "" {
			line = "-"
		}
		t.row(l.Agent, l.Issue, l.Scope, l.Key, owner, strconv.FormatInt(l.Fence, 10), held, stamp(l.AcquiredAt), ttl(l.TTL),
			strconv.FormatInt(l.Mailbox, 10), line, entry)
	}
	return t.flush()
}

// listSlots prints the concurrency limit keys in use (RUN_LIMITS), before the leases.
func listSlots(stdout io.Writer, slots []inspect.SlotInfo) error {
	if len(slots) == 0 {
		return nil
	}
	t := newTable(stdout, "LIMIT", "SLOTS")
	for _, sl := range slots {
		t.row(sl.Key, sl.Summary(time.Now()))
	}
	if err := t.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout)
	return err
}

// releaseLock force-releases agent's lease of key, after asking (checkLocksArgs checked both).
func releaseLock(ctx context.Context, s *session, cfg *config.Locks, agent, key string) error {
	in, stdout, stderr := s.in, s.stdout, s.stderr
	cur, err := in.Lease(ctx, agent, key)
	if errors.Is(err, inspect.ErrNotFound) {
		if cfg.JSON {
			return writeJSON(stdout, inspect.Released{Agent: agent, Issue: key})
		}
		fmt.Fprintf(stdout, "no live lease on %s %s; nothing released\n", agent, key)
		return nil
	}
	if err != nil {
		return inputKeyErr(err, key)
	}
	q := fmt.Sprintf("force-release %s %s held by %s (fence %d, held for %s, TTL %s, entry %s)?",
		agent, cur.Issue, orPlain(cur.Owner), cur.Fence, human(cur.Held), ttl(cur.TTL), orDash(cur.MessageID))
	if err := confirm(stderr, cfg.Yes, q); err != nil {
		return err
	}
	rel, err := in.ForceRelease(ctx, agent, cur.Issue)
	if err != nil {
		return err
	}
	if cfg.JSON {
		return writeJSON(stdout, rel)
	}
	if rel.Holder == nil {
		fmt.Fprintf(stdout, "no live lease on %s %s any more; nothing released\n", agent, rel.Issue)
		return nil
	}
	fmt.Fprintf(stdout, "released %s %s (was %s, fence %d); fence is now %d: the old holder is fenced out\n",
		agent, rel.Issue, orPlain(rel.Holder.Owner), rel.Holder.Fence, rel.Fence)
	fmt.Fprintf(stdout, "its run stops within a second, and entry %s runs again right after (about a second later) under a new lease, on the same worker or another\n",
		orDash(rel.Holder.MessageID))
	return nil
}

func orPlain(owner string) string {
	if owner == "" {
		return "a plain lock (no record)"
	}
	return owner
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
