package web

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a Server.
type Config struct {
	// Inspector reads and repairs the pipeline; Topology names its streams.
	Inspector *inspect.Inspector
	Topology  event.Topology
	// Token is a bearer token of the operator named "admin", role admin (the console's
	// single token before named operators); "" for none.
	Token string
	// Operators are the named operators, each with a role and the hash of its token
	// (ParseOperators reads them from a file). With neither Token, Operators nor
	// ProxyUserHeader the console is read-only.
	Operators []Operator
	// ProxyUserHeader, when set, names the header in which a trusted proxy in front of
	// the console (OpenShift's oauth-proxy: X-Forwarded-User) names the signed-in user;
	// it is believed only from TrustedProxies. The user's role is the one Operators
	// gives that name, else ProxyDefaultRole (default viewer).
	ProxyUserHeader  string
	TrustedProxies   []netip.Prefix
	ProxyDefaultRole string
	// TokenHint says how an operator gives the console its Token, in the refusal of a
	// write on a read-only console. Default: "a console token".
	TokenHint string
	// Redactor masks the process's own secrets in everything shown (nil: none known).
	Redactor *redact.Redactor
	Logger   zerolog.Logger
	// Refresh is how often pages refresh themselves (default 2s); ConsumerIdle the
	// idle time past which a consumer is shown as not alive (default 1m).
	Refresh      time.Duration
	ConsumerIdle time.Duration
	// RequestTimeout bounds the Redis work of one request (default 10s).
	RequestTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// TraceURLTemplate, when set, links each timeline entry that was traced to its trace
	// in a trace viewer: an http(s) URL in which "{trace_id}" stands for the 32-digit
	// hex trace id (https://jaeger.example.com/trace/{trace_id}). Default: no links.
	TraceURLTemplate string
}

// TraceIDPlaceholder is what Config.TraceURLTemplate's trace id replaces.
const TraceIDPlaceholder = "{trace_id}"

// ErrTraceURLTemplate is returned by New for a Config.TraceURLTemplate that is not an
// http(s) URL containing TraceIDPlaceholder.
var ErrTraceURLTemplate = errors.New("web: Config.TraceURLTemplate must be an http:// or https:// URL containing " + TraceIDPlaceholder)

func checkTraceURLTemplate(t string) error {
	if t == "" {
		return nil
	}
	u, err := url.Parse(strings.ReplaceAll(t, TraceIDPlaceholder, "0"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.Contains(t, TraceIDPlaceholder) {
		return fmt.Errorf("%w, got %q", ErrTraceURLTemplate, t)
	}
	return nil
}

// Input limits: anything longer is refused with a 4xx before any Redis work.
const (
	maxQuery   = 2048     // bytes of a URL's query string
	maxBody    = 64 << 10 // bytes of a form or JSON body
	maxIDs     = 1000     // dead-letter ids in one requeue or purge
	maxKeyLen  = 64       // an issue key as typed
	maxErrList = 240      // characters of an error in a list
	maxDetail  = 1200     // characters of a timeline detail (it wraps)
	maxShown   = 64 << 10 // characters of one value on a detail page
	maxRows    = 500      // rows of one list on a page (the API has them all)
)

// Server is the console's http.Handler.
type Server struct {
	cfg    Config
	in     *inspect.Inspector
	pages  map[string]*template.Template
	mux    *http.ServeMux
	secret []byte // signs session cookies and CSRF tokens; new at every start
	ops    []Operator
	table  []Route

	chartMu sync.Mutex // the overview's outcomes, reused for outcomesTTL
	chart   inspect.Outcomes
	chartAt time.Time
}

// New returns the console. It does no I/O.
func New(cfg Config) (*Server, error) {
	if cfg.Inspector == nil {
		return nil, errors.New("web: Config needs an Inspector")
	}
	if err := checkTraceURLTemplate(cfg.TraceURLTemplate); err != nil {
		return nil, err
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 2 * time.Second
	}
	if cfg.ConsumerIdle <= 0 {
		cfg.ConsumerIdle = time.Minute
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.TokenHint == "" {
		cfg.TokenHint = "a console token"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Redactor == nil {
		cfg.Redactor = redact.New()
	}
	if cfg.Token != "" {
		cfg.Redactor.Add(cfg.Token)
	}
	if cfg.ProxyDefaultRole == "" {
		cfg.ProxyDefaultRole = RoleViewer
	}
	if rank(cfg.ProxyDefaultRole) < 0 {
		return nil, fmt.Errorf("web: Config.ProxyDefaultRole %q is not one of %s", cfg.ProxyDefaultRole, strings.Join(Roles, ", "))
	}
	ops, err := operators(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, in: cfg.Inspector, secret: make([]byte, 32), pages: map[string]*template.Template{}, ops: ops}
	if _, err := rand.Read(s.secret); err != nil {
		return nil, fmt.Errorf("web: session key: %w", err)
	}
	for _, name := range []string{"overview", "leases", "release", "pending", "issue", "dead", "deadletter", "login", "error", "audit", "pauses"} {
		t, err := template.New("layout.html").Funcs(s.funcs()).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", name, err)
		}
		s.pages[name] = t
	}
	s.routes()
	return s, nil
}

// Writable reports whether write actions are on: some operator can be identified (a
// token, named operators, or a trusted proxy's header).
func (s *Server) Writable() bool { return len(s.ops) > 0 || s.cfg.ProxyUserHeader != "" }

// operators are cfg's named operators, and Token's as the admin "admin".
func operators(cfg Config) ([]Operator, error) {
	ops := append([]Operator(nil), cfg.Operators...)
	if cfg.Token != "" {
		ops = append(ops, Operator{Name: "admin", Role: RoleAdmin, TokenHash: HashToken(cfg.Token)})
	}
	seen := map[string]bool{}
	for _, op := range ops {
		if err := op.check(); err != nil {
			return nil, fmt.Errorf("web: %w", err)
		}
		if seen[op.Name] {
			return nil, fmt.Errorf("web: operator %q is named twice (Token is the operator \"admin\")", op.Name)
		}
		seen[op.Name] = true
	}
	return ops, nil
}

// Route is one route of the console: its pattern, and for a write the audit action it
// records (one of several when the request picks it) and the least role allowed.
type Route struct {
	Pattern string
	// Actions of a write route: what it can record in the audit trail. None for a read,
	// and for sign-in and sign-out, which change no state of the pipeline.
	Actions []string
	h       http.Handler
}

// Routes lists every route the console serves: a test walks them, so that a write that
// is not guarded (Server.write) is found.
func (s *Server) Routes() []Route { return s.table }

func (s *Server) routes() {
	static, _ := fs.Sub(staticFS, "static")
	read := func(p string, h http.Handler) Route { return Route{Pattern: p, h: h} }
	s.table = []Route{
		read("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static))),
		read("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })),
		read("GET /{$}", s.page(s.overview)),
		read("GET /leases", s.page(s.leases)),
		read("GET /leases/release", s.page(s.releaseConfirm)),
		{Pattern: "POST /leases/release", Actions: []string{inspect.ActionRelease},
			h: s.write(fixed(inspect.ActionRelease, RoleOperator), s.page(s.releasePost))},
		read("GET /pending", s.page(s.pending)),
		read("GET /issue", s.page(s.issue)),
		read("GET /audit", s.page(s.auditPage)),
		read("GET /dead-letters", s.page(s.deadLetters)),
		read("GET /dead-letters/{id}", s.page(s.deadLetter)),
		{Pattern: "POST /dead-letters", Actions: []string{inspect.ActionRequeue, inspect.ActionPurge},
			h: s.write(deadOp, s.page(s.deadLettersPost))},
		{Pattern: "POST /drain", Actions: []string{ActionDrain, ActionUndrain}, h: s.write(drainOp, s.page(s.drainPost))},
		read("GET /pauses", s.page(s.pausesPage)),
		{Pattern: "POST /pauses", Actions: []string{inspect.ActionPause, inspect.ActionResume},
			h: s.write(pauseOp, s.page(s.pausesPost))},
		read("GET /login", s.page(s.loginPage)),
		read("POST /login", s.page(s.loginPost)),
		read("POST /logout", s.page(s.logoutPost)),

		read("GET /api/v1/overview", s.api(s.apiOverview)),
		read("GET /api/v1/streams", s.api(s.apiStreams)),
		read("GET /api/v1/pending", s.api(s.apiPending)),
		read("GET /api/v1/leases", s.api(s.apiLeases)),
		read("GET /api/v1/outcomes", s.api(s.apiOutcomes)),
		read("GET /api/v1/issues/{key}", s.api(s.apiIssue)),
		read("GET /api/v1/audit", s.api(s.apiAudit)),
		read("GET /api/v1/dead-letters", s.api(s.apiDeadLetters)),
		read("GET /api/v1/dead-letters/{id}", s.api(s.apiDeadLetter)),
		{Pattern: "POST /api/v1/dead-letters/requeue", Actions: []string{inspect.ActionRequeue},
			h: s.write(fixed(inspect.ActionRequeue, RoleOperator), s.api(s.apiRequeue))},
		{Pattern: "POST /api/v1/dead-letters/purge", Actions: []string{inspect.ActionPurge},
			h: s.write(fixed(inspect.ActionPurge, RoleAdmin), s.api(s.apiPurge))},
		{Pattern: "POST /api/v1/leases/release", Actions: []string{inspect.ActionRelease},
			h: s.write(fixed(inspect.ActionRelease, RoleOperator), s.api(s.apiRelease))},
		read("GET /api/v1/drains", s.api(s.apiDrains)),
		{Pattern: "POST /api/v1/drain", Actions: []string{ActionDrain, ActionUndrain},
			h: s.write(drainOp, s.api(s.apiDrain))},
		read("GET /api/v1/pauses", s.api(s.apiPauses)),
		{Pattern: "POST /api/v1/pauses", Actions: []string{inspect.ActionPause},
			h: s.write(fixed(inspect.ActionPause, RoleOperator), s.api(s.apiPause))},
		{Pattern: "POST /api/v1/pauses/resume", Actions: []string{inspect.ActionResume},
			h: s.write(fixed(inspect.ActionResume, RoleOperator), s.api(s.apiResume))},
		read("/api/", s.api(func(*http.Request) (any, error) {
			return nil, &httpError{http.StatusNotFound, "no such API endpoint (see /api/v1/)"}
		})),
		read("/", s.page(func(http.ResponseWriter, *http.Request) (*view, error) {
			return nil, &httpError{http.StatusNotFound, "no such page"}
		})),
	}
	m := http.NewServeMux()
	for _, rt := range s.table {
		m.Handle(rt.Pattern, rt.h)
	}
	s.mux = m
}

// deadOp picks the action of a dead-letter form: requeue (operator) or purge (admin).
func deadOp(r *http.Request) (string, string, error) {
	switch r.PostFormValue("op") {
	case "requeue":
		return inspect.ActionRequeue, RoleOperator, nil
	case "purge":
		return inspect.ActionPurge, RoleAdmin, nil
	}
	return "", "", badRequest("op must be requeue or purge")
}

// csp allows the console's own script, style and fetches, and nothing else: no
// inline script, no frames, no form posts elsewhere.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP sets the security headers, refuses oversized input and serves.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on
	// the console's own form posts, which sameOrigin must refuse.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // a recovered panic value, compared as net/http compares it
				panic(v)
			}
			s.cfg.Logger.Error().Str("path", r.URL.Path).Interface("panic", v).Msg("console handler panicked")
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}()
	if len(r.URL.RawQuery) > maxQuery || len(r.URL.Path) > maxQuery {
		s.fail(w, r, &httpError{http.StatusRequestURITooLong, fmt.Sprintf("the address is longer than %d bytes", maxQuery)})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

// httpError is an error with the status and message the client gets.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// status maps an error to the response: what the client typed wrong is a 4xx with
// the reason; Redis trouble is a 503 (the console itself is fine).
func (s *Server) status(r *http.Request, err error) (int, string) {
	var he *httpError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &he):
		return he.code, he.msg
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)
	case errors.Is(err, lease.ErrInvalidKey), errors.Is(err, inspect.ErrBadID):
		return http.StatusBadRequest, s.clean(err.Error())
	case errors.Is(err, audit.ErrNoReason):
		return http.StatusBadRequest, "refused: say why: every write needs a reason (the form's reason field; the API's \"reason\"), recorded in the audit trail"
	case errors.Is(err, audit.ErrNoActor):
		return http.StatusUnauthorized, "refused: write actions need an operator"
	case errors.Is(err, audit.ErrNotRecorded):
		s.cfg.Logger.Error().Err(errors.New(s.clean(err.Error()))).Str("path", r.URL.Path).Msg("console write not recorded, not done")
		return http.StatusServiceUnavailable, "not done: the audit trail could not record this action, and a write that cannot be recorded does not happen (" + s.clean(err.Error()) + ")"
	case errors.Is(err, inspect.ErrNotFound):
		return http.StatusNotFound, s.clean(err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "Redis did not answer in time"
	}
	s.cfg.Logger.Warn().Err(errors.New(s.clean(err.Error()))).Str("path", r.URL.Path).Msg("console request failed")
	return http.StatusServiceUnavailable, "the pipeline's Redis could not answer: " + s.clean(err.Error())
}

// clean redacts the process's secrets from s.
func (s *Server) clean(v string) string { return s.cfg.Redactor.String(v) }

// clip redacts v, flattens its whitespace and bounds it to n characters.
func (s *Server) clip(v string, n int) string {
	v = strings.Join(strings.Fields(s.clean(v)), " ")
	if r := []rune(v); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return v
}

// bound redacts v and bounds it to maxShown characters, keeping its lines.
func (s *Server) bound(v string) string {
	v = s.clean(v)
	if r := []rune(v); len(r) > maxShown {
		return string(r[:maxShown]) + fmt.Sprintf("\n… (%d more characters)", len(r)-maxShown)
	}
	return v
}
