package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
)

const pendingHelp = `
Shows, per consumer group, the XPENDING summary (count, oldest and newest id, entries
per consumer), then every pending entry: id, consumer, idle time, deliveries, issue
key, and the lease guarding it (holder, fence, TTL left). An entry is "guarded" when a
live lease of its issue names it; otherwise it is "orphaned": no worker is on it, and
it is claimed and re-run once idle for MAX_IDLE_TIME (or dropped, if its issue is
locked for another entry by then). An input stream with entries and no consumer group
(no worker of its agent and branch ever started) says how many events wait for a
worker that does not exist.

Cost: 1 round trip for all summaries, 1 per 1000 entries of the longest group
(extended XPENDING pages, all groups pipelined), 1 per 1000 entries for their issue
keys (pipelined XRANGE id id), 1 per 500 issues for their leases. No SCAN.
`

// runPending prints pending entries per group with the lease guarding each.
func runPending(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Pending
	return operator{name: "pending", settings: &cfg, common: &cfg.Common, inspect: true,
		check: noArgs("filter with --agent, --branch, --issue"),
		work:  func(ctx context.Context, s *session) error { return listPending(ctx, s, &cfg) },
	}.run(ctx, args, stdout, stderr)
}

func listPending(ctx context.Context, s *session, cfg *config.Pending) error {
	stdout, stderr := s.stdout, s.stderr
	groups, err := s.in.Pending(ctx, inspect.PendingFilter{Agent: cfg.Agent, Branch: cfg.Branch, Issue: cfg.Issue})
	if err != nil {
		return inputKeyErr(err, cfg.Issue)
	}
	if cfg.JSON {
		if groups == nil {
			groups = []inspect.GroupPending{}
		}
		return writeJSON(stdout, inspect.PendingReport{Groups: groups})
	}
	pauseBanner(ctx, s)
	filters := []string{"agent", cfg.Agent, "branch", cfg.Branch, "issue", cfg.Issue}
	if err := listLines(ctx, s, cfg); err != nil {
		return err
	}
	if len(groups) == 0 {
		fmt.Fprintln(stdout, "no consumer groups yet (no worker has started on these streams)")
		noteFilters(stderr, &cfg.Common, filters...)
		return nil
	}
	if err := listDelayed(stdout, groups); err != nil {
		return err
	}
	t := newTable(stdout, "STREAM", "GROUP", "PENDING", "OLDEST", "NEWEST", "CONSUMERS")
	entries := 0
	for _, g := range groups {
		if g.NoGroup {
			t.row(g.Stream, g.Group+" (no such group)", "0", "", "", inspect.NoWorker(g.Waiting))
			continue
		}
		var cs []string
		for _, c := range g.Consumers {
			cs = append(cs, c.Name+"="+strconv.FormatInt(c.Pending, 10))
		}
		t.row(g.Stream, g.Group, strconv.FormatInt(g.Count, 10), g.Lowest, g.Highest, strings.Join(cs, " "))
		entries += len(g.Entries)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if entries == 0 {
		fmt.Fprintln(stdout, "no pending entries")
		noteFilters(stderr, &cfg.Common, filters...)
		return nil
	}
	t = newTable(stdout, "ID", "STREAM", "CONSUMER", "IDLE", "DELIVERIES", "ISSUE", "STATE", "HOLDER", "FENCE", "TTL", "NOTE")
	for _, g := range groups {
		for _, x := range g.Entries {
			holder, fence, left := "", "", ""
			if x.Lease != nil {
				holder, fence, left = x.Lease.Owner, strconv.FormatInt(x.Lease.Fence, 10), ttl(x.Lease.TTL)
				if holder == "" {
					holder = "(plain lock)"
				}
			}
			t.row(x.ID, g.Stream, x.Consumer, human(x.Idle), strconv.FormatInt(x.Deliveries, 10), x.Issue, x.State,
				holder, fence, left, x.Note)
		}
	}
	return t.flush()
}

// listDelayed prints the events re-queued by the busy policy delay, if any, and when
// each runs again.
func listDelayed(stdout io.Writer, groups []inspect.GroupPending) error {
	n := 0
	for _, g := range groups {
		n += len(g.Delayed)
	}
	if n == 0 {
		return nil
	}
	t := newTable(stdout, "DELAYED UNTIL", "STREAM", "ISSUE", "EVENT TYPE", "DELAYS", "FROM ENTRY", "CORRELATION ID")
	for _, g := range groups {
		for _, d := range g.Delayed {
			t.row(stamp(d.Until), g.Stream, d.IssueKey, d.EventType, strconv.Itoa(d.Delays), d.From, d.Correlation)
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	return nil
}

// listLines prints the keys whose line holds events (ON_CONFLICT=wait), if any: they are
// acked, so they are not pending entries, but they wait all the same.
func listLines(ctx context.Context, s *session, cfg *config.Pending) error {
	leases, err := s.in.Locks(ctx, inspect.LockFilter{Agent: cfg.Agent, Issue: cfg.Issue})
	if err != nil {
		return inputKeyErr(err, cfg.Issue)
	}
	var t *table
	now := time.Now()
	for _, l := range leases {
		if l.Waiting == 0 {
			continue
		}
		if t == nil {
			t = newTable(s.stdout, "WAITING FOR", "ISSUE", "LINE", "HELD BY", "FENCE")
		}
		holder := l.Owner
		if l.Reserved {
			holder = "(handed to the line's head)"
		}
		t.row(l.Agent, l.Issue, l.Line(now), holder, strconv.FormatInt(l.Fence, 10))
	}
	if t == nil {
		return nil
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(s.stdout)
	return nil
}
