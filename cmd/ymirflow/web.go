package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/web"
)

const webHelp = `
The operator console: overview, leases, pending entries, one issue's timeline and
dead letters in a browser, refreshing themselves; the same data as JSON under /api/v1/.
Write actions (requeue, purge, force release) need WEB_TOKEN or WEB_TOKEN_FILE; without
a token, or with --read-only, the console is read-only. It binds to loopback by default.
`

// runWeb serves the operator console until ctx ends.
func runWeb(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Web
	var token string
	return operator{name: "web", settings: &cfg, common: &cfg.Common, inspect: true,
		check: func(s *session) error {
			if err := noArgs("")(s); err != nil {
				return err
			}
			var err error
			token, err = cfg.WriteToken()
			return err
		},
		work: func(ctx context.Context, s *session) error { return console(ctx, s, &cfg, token) },
	}.run(ctx, args, stdout, stderr)
}

// console serves the console, whose write actions need token ("": read-only).
func console(ctx context.Context, s *session, cfg *config.Web, token string) error {
	e, in, stdout := s.env, s.in, s.stdout
	pipeline.WarnOldServer(ctx, e.rdb, e.log) // README, "Requirements"
	red := redact.New(append(environSecrets(os.Getenv), ownSecrets(&cfg.Common, "")...)...)
	srv, err := web.New(web.Config{Inspector: in, Topology: e.topology, Token: token, TokenHint: config.WebTokenHint, Redactor: red, Logger: e.log,
		Refresh: cfg.Refresh, ConsumerIdle: cfg.ConsumerIdle, TraceURLTemplate: cfg.TraceURLTemplate})
	if err != nil {
		return err
	}
	return serveConsole(ctx, cfg.Addr, srv, e.log, stdout)
}

// serveConsole listens on addr, prints the URL and serves until ctx ends.
func serveConsole(ctx context.Context, addr string, srv *web.Server, log zerolog.Logger, stdout io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return usageError{listenError("WEB_ADDR", "addr", addr, err)}
	}
	mode := "read-only"
	if srv.Writable() {
		mode = "write actions need the token"
	}
	fmt.Fprintf(stdout, "console: http://%s/ (%s)\n", ln.Addr(), mode)
	log.Info().Str("addr", ln.Addr().String()).Bool("writable", srv.Writable()).Msg("console serving")
	hs := httpsrv.New(srv, httpsrv.Limits{})
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console shutdown: %w", err)
	}
	return nil
}
