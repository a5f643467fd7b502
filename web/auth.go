package web

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
)

// Write actions are authorized by who sends them and their role (operators.go): an API
// client sends its operator token in Authorization; a browser signs in once with it and
// gets a session cookie naming the operator (HttpOnly, SameSite=Strict) signed with a
// key that lives as long as the process, and every form carries a CSRF token bound to
// that session; behind a trusted proxy the proxy's identity header names the operator.
// Every write that gets past the role check runs with its operator in the context
// (audit.WithOperator), so the Inspector records it in the audit trail before it acts;
// a write refused for its role is recorded as refused.

const sessionCookie = "ymirflow_session"

// readOnlyMsg is why writes are refused when no operator is configured.
func (s *Server) readOnlyMsg() string {
	return "this console is read-only: start it with " + s.cfg.TokenHint + " to allow write actions"
}

func (s *Server) mac(parts ...string) string {
	h := hmac.New(sha256.New, s.secret)
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// bearer returns the token of an Authorization: Bearer header ("" when none).
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// session returns the nonce and operator name of a valid session cookie
// ("<nonce>.<name>.<mac>").
func (s *Server) session(r *http.Request) (nonce, name string, ok bool) {
	if !s.Writable() {
		return "", "", false
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", "", false
	}
	nonce, rest, ok := strings.Cut(c.Value, ".")
	i := strings.LastIndexByte(rest, '.')
	if !ok || i < 0 || len(nonce) != 32 {
		return "", "", false
	}
	name, sig := rest[:i], rest[i+1:]
	if !hmac.Equal([]byte(sig), []byte(s.mac("session", nonce, name))) {
		return "", "", false
	}
	return nonce, name, true
}

// csrf is the token a form of session nonce must carry; a proxy user's is bound to its
// name (the proxy, not a cookie of ours, keeps its session).
func (s *Server) csrf(nonce string) string { return s.mac("csrf", nonce)[:32] }

func (s *Server) proxyCSRF(name string) string { return s.mac("csrf-proxy", name)[:32] }

// formCSRF is the CSRF token the pages put in r's forms ("" when r has no identity that
// needs one).
func (s *Server) formCSRF(r *http.Request) string {
	if nonce, _, ok := s.session(r); ok {
		return s.csrf(nonce)
	}
	if id, ok := s.proxyUser(r); ok {
		return s.proxyCSRF(id.Name)
	}
	return ""
}

func (s *Server) newSession(w http.ResponseWriter, r *http.Request, name string) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	nonce := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: nonce + "." + name + "." + s.mac("session", nonce, name), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// sameOrigin refuses a request that a browser sent from another origin. Browsers send
// Origin with every POST (and Sec-Fetch-Site); a request with neither comes from a
// non-browser client, which the token or the CSRF token must then authorize.
func sameOrigin(r *http.Request) error {
	o := r.Header.Get("Origin")
	switch site := r.Header.Get("Sec-Fetch-Site"); {
	case site != "" && site != "same-origin":
		return &httpError{http.StatusForbidden, "refused: the request comes from another site (" + site + ")"}
	case o == "":
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host {
		return &httpError{http.StatusForbidden, "refused: the request comes from another origin (" + o + ")"}
	}
	return nil
}

// authenticate says who sent the write r: a bearer token (the API and forms), a
// signed-in session with its form's CSRF token, or the trusted proxy's user (forms
// with its CSRF token).
func (s *Server) authenticate(r *http.Request) (identity, error) {
	if !s.Writable() {
		return identity{}, &httpError{http.StatusForbidden, s.readOnlyMsg()}
	}
	if err := sameOrigin(r); err != nil {
		return identity{}, err
	}
	id, ok := s.who(r)
	if !ok {
		if bearer(r) != "" {
			return identity{}, &httpError{http.StatusUnauthorized, "refused: that is not an operator's token"}
		}
		if strings.HasPrefix(r.URL.Path, "/api/") {
			return identity{}, &httpError{http.StatusUnauthorized, "refused: write actions need Authorization: Bearer <operator token>"}
		}
		return identity{}, &httpError{http.StatusUnauthorized, "refused: sign in with an operator token to use write actions"}
	}
	if id.Via == "bearer" || strings.HasPrefix(r.URL.Path, "/api/") {
		return id, nil
	}
	want := ""
	if nonce, _, ok := s.session(r); ok && id.Via == "session" {
		want = s.csrf(nonce)
	} else {
		want = s.proxyCSRF(id.Name)
	}
	if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(want)) {
		return identity{}, &httpError{http.StatusForbidden, "refused: the form's CSRF token is missing or stale; reload the page and try again"}
	}
	return id, nil
}

// write guards a write route: pick names the request's action and the least role that
// may do it. A sender without that role is refused with 403, and the refusal is
// recorded in the audit trail with the scope and reason the request gave; the others
// reach h with their operator in the context.
func (s *Server) write(pick func(*http.Request) (action, role string, err error), h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := s.authenticate(r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		action, role, err := pick(r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		op := audit.Operator{Who: id.Name, From: s.from(r), Role: id.Role}
		if rank(id.Role) < rank(role) {
			why := fmt.Sprintf("role %s may not %s: it needs the role %s", id.Role, action, role)
			e := s.asked(r, op.Entry(action, r.Method+" "+r.URL.Path))
			if err := s.in.AuditLog().Refused(r.Context(), e, why); err != nil {
				s.cfg.Logger.Warn().Err(err).Str("operator", id.Name).Msg("console: a refused write could not be recorded")
			}
			s.cfg.Logger.Warn().Str("operator", id.Name).Str("role", id.Role).Str("action", action).Msg("console: write refused for its role")
			s.fail(w, r, &httpError{http.StatusForbidden, "refused: " + why})
			return
		}
		h.ServeHTTP(w, r.WithContext(audit.WithOperator(r.Context(), op)))
	})
}

// writeFields are the fields of a write's form or JSON body that say what it asked for.
type writeFields struct {
	Agent  string   `json:"agent"`
	Issue  string   `json:"issue"`
	IDs    []string `json:"ids"`
	Reason string   `json:"reason"`
}

// asked fills e with the scope, issues and reason r asked for, for the record of a
// refusal; a JSON body is read and put back for the handler.
func (s *Server) asked(r *http.Request, e audit.Entry) audit.Entry {
	var f writeFields
	if strings.HasPrefix(r.URL.Path, "/api/") {
		b, err := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		if err != nil || json.Unmarshal(b, &f) != nil {
			return e
		}
	} else {
		f = writeFields{Agent: r.PostFormValue("agent"), Issue: r.PostFormValue("issue"), IDs: r.PostForm["id"], Reason: r.PostFormValue("reason")}
	}
	e.Reason = strings.TrimSpace(f.Reason)
	switch {
	case f.Agent != "" || f.Issue != "":
		key, err := s.in.CanonicalKey(strings.TrimSpace(f.Issue))
		if err != nil {
			key = s.clip(f.Issue, maxKeyLen)
		} else {
			e.Issues = []string{key}
		}
		e.Scope = "agent=" + s.clip(f.Agent, 40) + " issue=" + key
	case len(f.IDs) > 0 && len(f.IDs) <= maxIDs:
		e.Scope = inspect.IDsScope(f.IDs)
		e.Issues = s.in.DeadIssues(r.Context(), f.IDs)
	}
	return e
}

// fixed is the pick of a route with one action.
func fixed(action, role string) func(*http.Request) (string, string, error) {
	return func(*http.Request) (string, string, error) { return action, role, nil }
}

// because returns ctx with the operator's reason for the write ("" is refused by the
// audit trail: audit.ErrNoReason).
func because(ctx context.Context, reason string) context.Context {
	op := audit.OperatorFrom(ctx)
	op.Reason = strings.TrimSpace(reason)
	return audit.WithOperator(ctx, op)
}

// localPath returns next when it is a path of this site, else "/".
func localPath(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/"
	}
	return next
}
