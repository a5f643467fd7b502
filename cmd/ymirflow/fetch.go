package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

const fetchHelp = `
Sweeps Jira with JIRA_JQL and publishes a triage request for each issue that needs
one (fresh, ymir_todo from a member of JIRA_TRIGGER_GROUP, ymir_retry_needed, a
stale in-flight label), skipping issues whose lease is held. --once sweeps once and
exits; otherwise it sweeps every --interval until SIGTERM or SIGINT. Exit 1 when Jira
refuses the credentials (401/403) or Redis cannot be reached.
`

// runFetch sweeps Jira once (--once) or every --interval until SIGTERM/SIGINT, which lets
// the sweep in progress finish. Each sweep logs a summary line and prints a human one on
// stdout. Exit 1 when Jira refuses the credentials (401/403) or Redis cannot be reached;
// with --interval, other failed sweeps (Jira 5xx after retries, a Redis blip) are logged
// and the next sweep tries again.
func runFetch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Fetch
	return operator{name: "fetch", settings: &cfg, common: &cfg.Common, jira: &cfg.Jira,
		work: func(ctx context.Context, s *session) error { return fetch(ctx, s, &cfg) },
	}.run(ctx, args, stdout, stderr)
}

// fetch sweeps once, or every cfg.Interval until ctx ends.
func fetch(ctx context.Context, s *session, cfg *config.Fetch) error {
	e, jc, stdout := s.env, s.jira, s.stdout
	tp, stopTracing, err := startTracing(ctx, &cfg.Tracing, "fetch", e.log)
	if err != nil {
		return err
	}
	defer stopTracing()
	locker, err := e.newLocker(lease.Options{}) // the workers' key layout

	if err != nil {
		return usagef("%v", err)
	}
	f, err := fetcher.New(fetcher.Config{
		Jira: jc, Redis: e.rdb, Topology: e.topology, Locker: locker, MaxLen: cfg.MaxLen, MaxEventBytes: cfg.MaxEventBytes,
		JQL: cfg.JiraJQL, TriggerGroup: cfg.JiraTriggerGroup, MaxIssues: cfg.MaxIssues,
		StaleLabelThreshold: cfg.StaleLabelThreshold, DryRun: cfg.DryRun, Logger: e.log, TracerProvider: tp,
	})
	if err != nil {
		return usagef("%v", err)
	}

	for {
		// A signal stops a sweep between issues: the issue in hand is finished (published
		// and flipped), the rest wait for the next run.
		s, err := f.Sweep(ctx)
		fmt.Fprintf(stdout, "fetch: %s\n", s)
		if err != nil && ctx.Err() != nil {
			e.log.Info().Err(err).Msg("fetch: stopped by a signal during a sweep; the next run handles the rest")
			return nil
		}
		if err != nil {
			err = explainFetchError(err, cfg)
			if cfg.Once || fetcher.Fatal(err) {
				return err
			}
			e.log.Error().Err(err).Dur("retry_in", cfg.Interval).Msg("sweep failed; the next sweep tries again")
		}
		if cfg.Once {
			return nil
		}
		select {
		case <-ctx.Done():
			e.log.Info().Msg("fetch: stopping")
			return nil
		case <-time.After(cfg.Interval):
		}
	}
}

// explainFetchError says what the operator should check.
func explainFetchError(err error, cfg *config.Fetch) error {
	switch {
	case errors.Is(err, jira.ErrUnauthorized):
		return fmt.Errorf("Jira at %s refused the credentials (401): check JIRA_EMAIL and JIRA_TOKEN or JIRA_TOKEN_FILE: %w",
			redact.URL(cfg.JiraURL), err)
	case errors.Is(err, jira.ErrForbidden):
		return fmt.Errorf("Jira at %s refused the search (403): the account may not run JIRA_JQL or see its issues: %w",
			redact.URL(cfg.JiraURL), err)
	case errors.Is(err, jira.ErrRateLimited):
		return fmt.Errorf("Jira at %s kept answering 429 after the retries: %w", redact.URL(cfg.JiraURL), err)
	case errors.Is(err, fetcher.ErrRedis):
		return fmt.Errorf("Redis at %s: %w", cfg.RedactedRedisURL(), err)
	}
	return fmt.Errorf("Jira at %s: %w", redact.URL(cfg.JiraURL), err)
}
