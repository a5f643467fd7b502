package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/web"
)

const auditHelp = `
The operators' audit trail, newest first: every write an operator made (locks release,
replay, dlq requeue, dlq purge, budget approve, the console's force release, requeue and
purge), with when, who (the CLI's YMIR_OPERATOR or user@host, the console's
signed-in operator), the role, where from (the CLI's host, the console's client
address), the action and its exact scope, the reason, and how it ended (done, failed,
refused, or started while it runs). A write is recorded before it runs and is not done
when it cannot be recorded. history KEY shows the writes on one issue beside its events.

Cost: the stream read backwards in pages of 500 until --limit writes or --since.
`

// runAudit lists the audit trail.
func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Audit
	return operator{name: "audit", settings: &cfg, common: &cfg.Common, inspect: true,
		work: func(ctx context.Context, s *session) error { return listAudit(ctx, s, &cfg) },
	}.run(ctx, args, stdout, stderr)
}

func listAudit(ctx context.Context, s *session, cfg *config.Audit) error {
	f := audit.Filter{Who: cfg.Who, Action: cfg.Action, Issue: strings.TrimSpace(cfg.Issue), Limit: cfg.Limit}
	if cfg.Since > 0 {
		f.Since = time.Now().Add(-cfg.Since)
	}
	recs, err := s.in.Audit(ctx, f)
	if err != nil {
		return inputKeyErr(err, cfg.Issue)
	}
	if cfg.JSON {
		return writeJSON(s.stdout, web.AuditReport{Records: recs})
	}
	if len(recs) == 0 {
		fmt.Fprintln(s.stdout, "no operator writes recorded")
		noteFilters(s.stderr, &cfg.Common, "who", cfg.Who, "action", cfg.Action, "issue", cfg.Issue)
		return nil
	}
	t := newTable(s.stdout, "TIME", "WHO", "ROLE", "FROM", "ACTION", "SCOPE", "REASON", "OUTCOME")
	for _, r := range recs {
		out := r.Outcome
		if r.Detail != "" {
			out += ": " + clip(r.Detail, 80)
		}
		t.row(stamp(r.Time), r.Who, orDash(r.Role), r.From, r.Action, clip(r.Scope, 80), clip(r.Reason, 80), out)
	}
	return t.flush()
}

// asOperator is ctx carrying the CLI's operator (config.Writer.Who) and reason: the
// Inspector records its writes under it in the audit trail before they run.
func asOperator(ctx context.Context, w *config.Writer) context.Context {
	who, from := w.Who()
	return audit.WithOperator(ctx, audit.Operator{Who: who, From: from, Reason: w.Reason})
}
