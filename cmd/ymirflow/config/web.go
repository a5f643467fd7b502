package config

import (
	"flag"
	"fmt"
	"net"
	"strings"
	"time"
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
}

// Register defines the console's flags on fs.
func (w *Web) Register(fs *flag.FlagSet) {
	w.Common.Register(fs)
	stringVarEnv(fs, &w.Addr, "addr", "WEB_ADDR", DefaultWebAddr, "listen address of the console; keep it on loopback or behind a NetworkPolicy")
	fs.StringVar(&w.Token, "web-token", "", "bearer token that write actions (requeue, purge, force release) need; empty: the console is read-only; prefer --web-token-file")
	fs.StringVar(&w.TokenFile, "web-token-file", "", "file that holds the bearer token, read once at start-up")
	boolVarEnv(fs, &w.ReadOnly, "read-only", "WEB_READ_ONLY", false, "refuse every write action, even with a token (the default when no token is set)")
	durationVarEnv(fs, &w.Refresh, "refresh", "WEB_REFRESH", DefaultWebRefresh, "how often pages refresh themselves")
	durationVarEnv(fs, &w.ConsumerIdle, "consumer-idle", "WEB_CONSUMER_IDLE", DefaultConsumerIdle, "a consumer idle for longer is shown as not alive")
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
	return p.err()
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
const WebTokenHint = "WEB_TOKEN or WEB_TOKEN_FILE (and without --read-only)"
