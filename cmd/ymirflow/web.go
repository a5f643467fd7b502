package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
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
Write actions need an operator, each with a role: viewer (reads), operator (force
release, requeue), admin (also purge). Operators are named in WEB_OPERATORS_FILE, one a
line "NAME ROLE sha256:HEX" (the SHA-256 of the operator's token, never the token:
--new-token NAME:ROLE prints a fresh token and its line), or by a trusted proxy's
header (WEB_PROXY_USER_HEADER, e.g. X-Forwarded-User behind OpenShift's oauth-proxy,
believed only from WEB_TRUSTED_PROXIES). WEB_TOKEN or WEB_TOKEN_FILE is the token of an
operator "admin" with the role admin. A viewer's write is refused (403) and recorded.
Every write needs a reason and is recorded in the audit trail (the Audit page,
ymirflow audit) before it runs. Without operators, or with --read-only, the console is
read-only. It binds to loopback by default.
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
			if cfg.NewToken != "" {
				return newToken(cfg.NewToken, s.stdout)
			}
			var err error
			token, err = cfg.WriteToken()
			return err
		},
		work: func(ctx context.Context, s *session) error { return console(ctx, s, &cfg, token) },
	}.run(ctx, args, stdout, stderr)
}

// errPrinted ends a command that has done its work in check (exit 0).
var errPrinted = flag.ErrHelp

// newToken prints a fresh token for spec (NAME:ROLE, checked) and its operators-file line.
func newToken(spec string, stdout io.Writer) error {
	name, role, _ := strings.Cut(spec, ":")
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	tok := hex.EncodeToString(b)
	fmt.Fprintf(stdout, "token (give it to %s; it is not stored anywhere): %s\n", name, tok)
	fmt.Fprintf(stdout, "operators-file line:\n%s %s %s\n", name, role, web.HashToken(tok))
	return errPrinted
}

// console serves the console, whose write actions need token ("": read-only).
func console(ctx context.Context, s *session, cfg *config.Web, token string) error {
	e, in, stdout := s.env, s.in, s.stdout
	pipeline.WarnOldServer(ctx, e.rdb, e.log) // README, "Requirements"
	red := redact.New(append(environSecrets(os.Getenv), ownSecrets(&cfg.Common, "")...)...)
	ops, err := cfg.Operators()
	if err != nil {
		return err
	}
	proxies, _ := cfg.Proxies() // checked by Validate
	hdr := cfg.ProxyUserHeader
	if cfg.ReadOnly {
		hdr = ""
	}
	srv, err := web.New(web.Config{Inspector: in, Topology: e.topology, Token: token, TokenHint: config.WebTokenHint, Redactor: red, Logger: e.log,
		Refresh: cfg.Refresh, ConsumerIdle: cfg.ConsumerIdle, TraceURLTemplate: cfg.TraceURLTemplate,
		Operators: ops, ProxyUserHeader: hdr, TrustedProxies: proxies, ProxyDefaultRole: cfg.ProxyDefaultRole})
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
		mode = "write actions need an operator's token and a reason"
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
