package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
)

const dlqHelp = `
The dead-letter stream: events that were bad (not JSON, no or invalid issue key,
unknown schema or event type) or failed every retry.

  dlq list [--issue KEY] [--before ID|AGE]
      id, age, original stream and id, issue, event type, agent, attempts, error.
  dlq show ID
      one dead letter whole: metadata and payload.
  dlq requeue ID... --reason WHY
  dlq requeue --all [--issue KEY] --reason WHY
      publishes each dead letter's original fields (uuid, payload, metadata; not the
      dead_* fields) back to the stream it was read from and deletes it from the
      dead-letter stream, both in one MULTI/EXEC under WATCH: a crash cannot lose or
      duplicate it, and requeueing the same id twice moves it once.
  dlq purge [--before ID|AGE] --reason WHY [--yes]
      deletes dead letters older than --before (a stream id, or an age such as 72h),
      or all of them. Asks y/N unless --yes; without a terminal and without --yes it
      refuses (exit 2).

Requeue and purge are operator writes: each is recorded in the audit trail (ymirflow
audit) with --reason, who (YMIR_OPERATOR, default user@host) and when before it runs,
and is not done when it cannot be recorded.

Cost: list and requeue --all read the dead-letter stream in pages of 1000 (1 round
trip each; --issue is matched on the client); show 1 round trip; requeue 2 round
trips per 100 ids (more if the dead-letter stream changes meanwhile); purge 1 (plus
the count for the question).
`

// runDLQ manages the dead-letter stream.
func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.DLQ
	return operator{name: "dlq", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if err := checkDLQArgs(&cfg, s.pos); err != nil {
				return err
			}
			if sub := s.pos[0]; sub == "requeue" || sub == "purge" {
				return cfg.NeedReason("dlq " + sub)
			}
			return nil
		},
		work: func(ctx context.Context, s *session) error { return dlq(asOperator(ctx, &cfg.Writer), s, &cfg) },
	}.run(ctx, args, stdout, stderr)
}

// checkDLQArgs checks the subcommand and its arguments.
func checkDLQArgs(cfg *config.DLQ, pos []string) error {
	if len(pos) == 0 {
		return usagef("dlq needs a subcommand: list, show ID, requeue ID..., requeue --all, purge")
	}
	sub, rest := pos[0], pos[1:]
	switch sub {
	case "list", "show", "requeue", "purge":
	default:
		return usagef("unknown dlq subcommand %q: list, show ID, requeue ID..., requeue --all, purge", sub)
	}
	if cfg.All && sub != "requeue" {
		return usagef("--all goes with requeue")
	}
	switch {
	case sub == "show" && len(rest) != 1:
		return usagef("dlq show takes one id (got %q)", rest)
	case sub == "requeue" && cfg.All && len(rest) > 0:
		return usagef("dlq requeue takes ids or --all, not both")
	case sub == "requeue" && !cfg.All && len(rest) == 0:
		return usagef("dlq requeue needs ids, or --all [--issue KEY]")
	case (sub == "list" || sub == "purge") && len(rest) > 0:
		return usagef("dlq %s takes no arguments (got %q)", sub, rest)
	}
	for _, id := range rest {
		if err := inspect.CheckID(id); err != nil {
			return usageError{err}
		}
	}
	return nil
}

// dlq runs the subcommand that checkDLQArgs checked.
func dlq(ctx context.Context, s *session, cfg *config.DLQ) error {
	sub, rest := s.pos[0], s.pos[1:]
	in, stdout, stderr := s.in, s.stdout, s.stderr
	switch sub {
	case "list":
		return dlqList(ctx, in, cfg, stdout, stderr)
	case "show":
		return dlqShow(ctx, in, cfg, rest[0], stdout)
	case "requeue":
		return dlqRequeue(ctx, in, cfg, rest, stdout)
	default:
		return dlqPurge(ctx, in, cfg, stdout, stderr)
	}
}

func dlqList(ctx context.Context, in *inspect.Inspector, cfg *config.DLQ, stdout, stderr io.Writer) error {
	dls, err := in.DeadLetters(ctx, inspect.DeadFilter{Issue: cfg.Issue, Before: cfg.BeforeID(time.Now())})
	if err != nil {
		return inputKeyErr(err, cfg.Issue)
	}
	if cfg.JSON {
		return writeJSON(stdout, inspect.DeadLettersReport{DeadLetters: dls})
	}
	if len(dls) == 0 {
		fmt.Fprintln(stdout, "no dead letters")
		noteFilters(stderr, &cfg.Common, "issue", cfg.Issue, "before", cfg.Before)
		return nil
	}
	t := newTable(stdout, "ID", "AGE", "STREAM", "ORIGINAL ID", "ISSUE", "EVENT", "AGENT", "ATTEMPTS", "ERROR")
	for _, d := range dls {
		t.row(d.ID, human(time.Since(d.Time)), d.Stream, d.OriginalID, d.Issue, d.EventType, d.Agent,
			strconv.Itoa(d.Attempts), inspect.ErrorBrief(d.Error, 100))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d dead letter(s)\n", len(dls))
	return nil
}

func dlqShow(ctx context.Context, in *inspect.Inspector, cfg *config.DLQ, id string, stdout io.Writer) error {
	d, err := in.DeadLetter(ctx, id)
	if err != nil {
		return inputErr(err)
	}
	if cfg.JSON {
		return writeJSON(stdout, d)
	}
	t := newRecordTable(stdout)
	t.row("id", d.ID)
	t.row("buried", stamp(d.Time)+" ("+human(time.Since(d.Time))+" ago)")
	t.row("stream", d.Stream)
	t.row("original id", d.OriginalID)
	t.row("issue", d.Issue)
	t.row("event type", d.EventType)
	t.row("agent", d.Agent)
	t.row("attempts", strconv.Itoa(d.Attempts))
	t.row("error", d.Error)
	t.row("uuid", d.UUID)
	keys := make([]string, 0, len(d.Metadata))
	for k := range d.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.row("m:"+k, d.Metadata[k])
	}
	t.row("payload", d.Payload)
	return t.flush()
}

func dlqRequeue(ctx context.Context, in *inspect.Inspector, cfg *config.DLQ, ids []string, stdout io.Writer) error {
	var done []inspect.Requeued
	var err error
	if cfg.All {
		done, err = in.RequeueAll(ctx, cfg.Issue)
	} else {
		done, err = in.Requeue(ctx, ids...)
	}
	if done == nil {
		done = []inspect.Requeued{}
	}
	if cfg.JSON {
		errs := []string{}
		for _, e := range inspect.Errors(err) {
			errs = append(errs, e.Error())
		}
		if jerr := writeJSON(stdout, inspect.RequeueReport{Requeued: done, Errors: errs}); jerr != nil {
			return jerr
		}
		return inputKeyErr(err, cfg.Issue)
	}
	if len(done) > 0 {
		t := newTable(stdout, "DEAD ID", "STREAM", "NEW ID", "ISSUE", "EVENT")
		for _, r := range done {
			t.row(r.DeadID, r.Stream, r.ID, r.Issue, r.EventType)
		}
		if ferr := t.flush(); ferr != nil {
			return ferr
		}
	}
	fmt.Fprintf(stdout, "requeued %d dead letter(s)\n", len(done))
	return inputKeyErr(err, cfg.Issue)
}

func dlqPurge(ctx context.Context, in *inspect.Inspector, cfg *config.DLQ, stdout, stderr io.Writer) error {
	before := cfg.BeforeID(time.Now())
	if !cfg.Yes {
		dls, err := in.DeadLetters(ctx, inspect.DeadFilter{Before: before})
		if err != nil {
			return inputErr(err)
		}
		if len(dls) == 0 {
			if cfg.JSON {
				return writeJSON(stdout, inspect.PurgeReport{})
			}
			fmt.Fprintln(stdout, "no dead letters to purge")
			return nil
		}
		q := fmt.Sprintf("purge all %d dead letter(s)? This cannot be undone.", len(dls))
		if before != "" {
			q = fmt.Sprintf("purge the %d dead letter(s) older than %s? This cannot be undone.", len(dls), before)
		}
		if err := confirm(stderr, cfg.Yes, q); err != nil {
			return err
		}
	}
	n, err := in.Purge(ctx, before)
	if err != nil {
		return inputErr(err)
	}
	if cfg.JSON {
		return writeJSON(stdout, inspect.PurgeReport{Purged: n})
	}
	fmt.Fprintf(stdout, "purged %d dead letter(s)\n", n)
	return nil
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
