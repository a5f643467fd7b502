package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/pipeline"
)

const fakejiraHelp = `
Serves an in-memory fake Jira for local trials until SIGTERM or SIGINT: sample
issues covering every fetcher rule (--issues N, --seed S), or those of a JSON file
(--issues-file: an array shaped as Jira's REST API returns issues). Any JQL returns
every issue; any credentials are accepted. --webhook sends a signed delivery to each
URL on every label change and issue creation. It prints the URL to use as JIRA_URL.
`

// runFakeJira serves the in-memory fake Jira until SIGTERM/SIGINT: sample issues covering
// every fetcher rule (--issues N, --seed S), or the issues of a JSON file (--issues-file).
// Any JQL returns every issue; any credentials are accepted. It prints the URL to use.
func runFakeJira(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.FakeJira
	pos, err := loadCmd("fakejira", &cfg, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q", pos)
	}
	log, err := pipeline.NewLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return usagef("LOG_LEVEL: %v", err)
	}
	issues := fakejira.SampleIssues(cfg.Issues, cfg.Seed)
	source := fmt.Sprintf("%d sample issues (seed %d)", len(issues), cfg.Seed)
	if cfg.IssuesFile != "" {
		if issues, err = fakejira.LoadFile(cfg.IssuesFile); err != nil {
			return err
		}
		source = fmt.Sprintf("%d issues from %s", len(issues), cfg.IssuesFile)
	}
	secret, err := cfg.Secret()
	if err != nil {
		return err
	}
	var hooks []fakejira.WebhookTarget
	for _, u := range cfg.WebhookURLs() {
		hooks = append(hooks, fakejira.WebhookTarget{URL: u, Secret: secret})
	}
	srv := fakejira.New(fakejira.Options{Issues: issues, Groups: fakejira.SampleGroups(), Webhooks: hooks})

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return listenError("ADDR", "addr", cfg.Addr, err)
	}
	host := ln.Addr().String()
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		host = net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
	}
	url := "http://" + host
	hs := httpsrv.New(logRequests(log, srv), httpsrv.Limits{})
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	log.Info().Str("url", url).Int("issues", len(issues)).Strs("webhooks", cfg.WebhookURLs()).Msg("fakejira serving")
	fmt.Fprintf(stdout, "fakejira: serving %s at %s\n", source, url)
	fmt.Fprintf(stdout, "  try: JIRA_URL=%s JIRA_TOKEN=any JIRA_TRIGGER_GROUP=%q ymirflow fetch --once\n", url, fakejira.SampleTriggerGroup)
	for _, u := range cfg.WebhookURLs() {
		fmt.Fprintf(stdout, "  webhooks to %s on label changes (act as a maintainer: PUT with header %s: %s)\n",
			u, fakejira.HeaderActAs, fakejira.SampleMaintainer.AccountID)
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("fakejira: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("fakejira: shutdown: %w", err)
	}
	log.Info().Int("writes", len(srv.Writes())).Msg("fakejira stopped")
	return nil
}

// logRequests logs each request at debug level with the status it got.
func logRequests(log zerolog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		next.ServeHTTP(sw, r)
		log.Debug().Str("method", r.Method).Str("path", r.URL.Path).Str("query", r.URL.RawQuery).
			Int("status", sw.status).Dur("took", time.Since(start)).Msg("fakejira request")
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}
