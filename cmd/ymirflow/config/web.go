package config

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/web"
)

// Defaults of `ymirflow web`.
const (
	DefaultWebAddr      = "127.0.0.1:8080"
	DefaultWebRefresh   = 2 * time.Second
	DefaultConsumerIdle = time.Minute
)

// Web is the settings of `ymirflow web`: the operator console.
type Web struct {
	Common
	Addr      string // --addr, WEB_ADDR: listen address (loopback by default)
	Token     string // --web-token, WEB_TOKEN: bearer token that write actions need (empty: read-only)
	TokenFile string // --web-token-file, WEB_TOKEN_FILE: file holding the token (read by WriteToken)
	ReadOnly  bool   // --read-only, WEB_READ_ONLY: refuse every write action even with a token
	// Refresh (--refresh, WEB_REFRESH) is how often pages refresh themselves;
	// ConsumerIdle (--consumer-idle, WEB_CONSUMER_IDLE) the idle time past which a
	// consumer is shown as not alive.
	Refresh      time.Duration
	ConsumerIdle time.Duration
	// TraceURLTemplate (--trace-url-template, TRACE_URL_TEMPLATE) links the issue
	// timeline's traced entries to a trace viewer; {trace_id} stands for the trace id.
	TraceURLTemplate string
	// OperatorsFile (--operators-file, WEB_OPERATORS_FILE) names the console's operators,
	// one a line: NAME ROLE [sha256:HEX] (web.ParseOperators); ymirflow web --new-token
	// NAME ROLE prints a token and its line.
	OperatorsFile string
	// ProxyUserHeader (--proxy-user-header, WEB_PROXY_USER_HEADER) is the header a trusted
	// proxy names the signed-in user in (oauth-proxy: X-Forwarded-User); believed only
	// from TrustedProxies (--trusted-proxies, WEB_TRUSTED_PROXIES: CIDRs, comma
	// separated); such a user not in the operators file has ProxyDefaultRole
	// (--proxy-default-role, WEB_PROXY_DEFAULT_ROLE).
	ProxyUserHeader  string
	TrustedProxies   string
	ProxyDefaultRole string
	// NewToken (--new-token NAME:ROLE, flag only) prints a fresh operator token and its
	// operators-file line, and exits.
	NewToken string
}

// DefaultTrustedProxies is where a proxy's identity header is believed by default: a
// sidecar on the pod's loopback, as oauth-proxy runs.
const DefaultTrustedProxies = "127.0.0.1/32,::1/128"

// Register defines the console's flags on fs.
func (w *Web) Register(fs *flag.FlagSet) {
	w.Common.Register(fs)
	stringVarEnv(fs, &w.Addr, "addr", "WEB_ADDR", DefaultWebAddr, "listen address of the console; keep it on loopback or behind a NetworkPolicy")
	fs.StringVar(&w.Token, "web-token", "", "bearer token that write actions (requeue, purge, force release) need; empty: the console is read-only; prefer --web-token-file")
	fs.StringVar(&w.TokenFile, "web-token-file", "", "file that holds the bearer token, read once at start-up")
	boolVarEnv(fs, &w.ReadOnly, "read-only", "WEB_READ_ONLY", false, "refuse every write action, even with a token (the default when no token is set)")
	durationVarEnv(fs, &w.Refresh, "refresh", "WEB_REFRESH", DefaultWebRefresh, "how often pages refresh themselves")
	durationVarEnv(fs, &w.ConsumerIdle, "consumer-idle", "WEB_CONSUMER_IDLE", DefaultConsumerIdle, "a consumer idle for longer is shown as not alive")
	stringVarEnv(fs, &w.OperatorsFile, "operators-file", "WEB_OPERATORS_FILE", "", "file naming the console's operators, one a line: NAME ROLE [sha256:HEX] (roles viewer, operator, admin; --new-token prints a line)")
	stringVarEnv(fs, &w.ProxyUserHeader, "proxy-user-header", "WEB_PROXY_USER_HEADER", "", "header in which a trusted proxy names the signed-in user, e.g. X-Forwarded-User (oauth-proxy); empty: none")
	stringVarEnv(fs, &w.TrustedProxies, "trusted-proxies", "WEB_TRUSTED_PROXIES", DefaultTrustedProxies, "CIDRs (comma separated) whose requests may carry --proxy-user-header")
	stringVarEnv(fs, &w.ProxyDefaultRole, "proxy-default-role", "WEB_PROXY_DEFAULT_ROLE", "viewer", "role of a proxy user the operators file does not name: viewer, operator or admin")
	fs.StringVar(&w.NewToken, "new-token", "", "print a fresh operator token for NAME:ROLE and its operators-file line, then exit")
	flagOnly(fs, "new-token")
	fs.StringVar(&w.TraceURLTemplate, "trace-url-template", "", "link the issue timeline's traced entries to a trace viewer: an http(s) URL where {trace_id} stands for the trace id, e.g. https://jaeger.example.com/trace/{trace_id} (empty: no links)")
}

// Validate checks the console's settings.
func (w *Web) Validate() error {
	var p problems
	w.Common.validate(&p)
	if _, _, err := net.SplitHostPort(w.Addr); err != nil {
		p.add("addr", "= %q must be host:port or :port", w.Addr)
	}
	if w.Token != "" && w.TokenFile != "" {
		p.add("web-token-file", "and WEB_TOKEN (--web-token) are both set; set one")
	}
	if w.TokenFile != "" {
		token, err := ReadSecretFile(w.TokenFile)
		switch {
		case err != nil:
			p.add("web-token-file", "= %q cannot be read: %v", w.TokenFile, err)
		case len(token) < MinWebToken:
			p.add("web-token-file", "= %q holds fewer than %d characters", w.TokenFile, MinWebToken)
		}
	}
	if w.Token != "" && len(w.Token) < MinWebToken {
		p.add("web-token", "must have at least %d characters", MinWebToken)
	}
	if w.Refresh < 200*time.Millisecond {
		p.add("refresh", "= %s must be at least 200ms", fmtDur(w.Refresh))
	}
	t := w.TraceURLTemplate
	if ok := strings.Contains(t, "{trace_id}") && (strings.HasPrefix(t, "http://") || strings.HasPrefix(t, "https://")); t != "" && !ok {
		p.add("trace-url-template", "= %q must be an http:// or https:// URL containing {trace_id}", t)
	}
	if w.ConsumerIdle <= 0 {
		p.add("consumer-idle", "= %s must be positive", fmtDur(w.ConsumerIdle))
	}
	w.validateOperators(&p)
	return p.err()
}

func (w *Web) validateOperators(p *problems) {
	if w.OperatorsFile != "" {
		if _, err := w.Operators(); err != nil {
			p.add("operators-file", "= %q: %v", w.OperatorsFile, err)
		}
	}
	if _, err := w.Proxies(); err != nil {
		p.add("trusted-proxies", "= %q: %v", w.TrustedProxies, err)
	}
	if !slices.Contains(web.Roles, w.ProxyDefaultRole) {
		p.add("proxy-default-role", "= %q is not one of %s", w.ProxyDefaultRole, strings.Join(web.Roles, ", "))
	}
	if w.NewToken != "" {
		name, role, ok := strings.Cut(w.NewToken, ":")
		if _, err := web.ParseOperators(strings.NewReader(name + " " + role)); !ok || err != nil {
			p.addFlag("new-token", "= %q must be NAME:ROLE, e.g. alice:operator (roles %s)", w.NewToken, strings.Join(web.Roles, ", "))
		}
	}
}

// Operators reads OperatorsFile (none when unset or ReadOnly).
func (w *Web) Operators() ([]web.Operator, error) {
	if w.OperatorsFile == "" || w.ReadOnly {
		return nil, nil
	}
	f, err := os.Open(w.OperatorsFile)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return web.ParseOperators(io.LimitReader(f, 1<<20))
}

// Proxies parses TrustedProxies.
func (w *Web) Proxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range strings.Split(w.TrustedProxies, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		pr, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR such as 127.0.0.1/32", c)
		}
		out = append(out, pr)
	}
	return out, nil
}

// MinWebToken is the shortest accepted console token: a guessable token is no
// protection.
const MinWebToken = 16

// WriteToken returns the token write actions need: Token, or the trimmed content of
// TokenFile, read now; "" when writes are off (no token, or ReadOnly).
func (w *Web) WriteToken() (string, error) {
	if w.ReadOnly {
		return "", nil
	}
	if w.Token != "" || w.TokenFile == "" {
		return w.Token, nil
	}
	token, err := ReadSecretFile(w.TokenFile)
	if err != nil {
		return "", &SettingError{Env: "WEB_TOKEN_FILE", Flag: "web-token-file",
			Msg: fmt.Sprintf("= %q cannot be read: %v", w.TokenFile, err)}
	}
	return token, nil
}

// WebTokenHint tells an operator how to give the console its token: the console says
// it when it refuses a write because it is read-only.
const WebTokenHint = "WEB_OPERATORS_FILE, WEB_PROXY_USER_HEADER, WEB_TOKEN or WEB_TOKEN_FILE (and without --read-only)"
