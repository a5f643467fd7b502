package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

// Write actions are authorized by the bearer token: an API client sends it in
// Authorization; a browser signs in once with it and gets a session cookie
// (HttpOnly, SameSite=Strict) signed with a key that lives as long as the process,
// and every form carries a CSRF token bound to that session.

const sessionCookie = "ymirflow_session"

// readOnlyMsg is why writes are refused when no token is configured.
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

// tokenOK compares t with the configured token in constant time.
func (s *Server) tokenOK(t string) bool {
	if s.cfg.Token == "" || t == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(t)), sha256.Sum256([]byte(s.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// bearer returns the token of an Authorization: Bearer header ("" when none).
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// session returns the nonce of a valid session cookie.
func (s *Server) session(r *http.Request) (string, bool) {
	if s.cfg.Token == "" {
		return "", false
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", false
	}
	nonce, sig, ok := strings.Cut(c.Value, ".")
	if !ok || len(nonce) != 32 || !hmac.Equal([]byte(sig), []byte(s.mac("session", nonce))) {
		return "", false
	}
	return nonce, true
}

// csrf is the token a form of session nonce must carry.
func (s *Server) csrf(nonce string) string { return s.mac("csrf", nonce)[:32] }

func (s *Server) newSession(w http.ResponseWriter, r *http.Request) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	nonce := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: nonce + "." + s.mac("session", nonce), Path: "/",
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

// authorizeAPI checks an API write: the bearer token.
func (s *Server) authorizeAPI(r *http.Request) error {
	if s.cfg.Token == "" {
		return &httpError{http.StatusForbidden, s.readOnlyMsg()}
	}
	if !s.tokenOK(bearer(r)) {
		return &httpError{http.StatusUnauthorized, "refused: write actions need Authorization: Bearer <console token>"}
	}
	return sameOrigin(r)
}

// authorizeForm checks a form post of the pages: same origin, then the bearer token,
// or a signed-in session and its CSRF token.
func (s *Server) authorizeForm(r *http.Request) error {
	if s.cfg.Token == "" {
		return &httpError{http.StatusForbidden, s.readOnlyMsg()}
	}
	if err := sameOrigin(r); err != nil {
		return err
	}
	if s.tokenOK(bearer(r)) {
		return nil
	}
	nonce, ok := s.session(r)
	if !ok {
		return &httpError{http.StatusUnauthorized, "refused: sign in with the console token to use write actions"}
	}
	if !hmac.Equal([]byte(r.PostFormValue("csrf")), []byte(s.csrf(nonce))) {
		return &httpError{http.StatusForbidden, "refused: the form's CSRF token is missing or stale; reload the page and try again"}
	}
	return nil
}

// localPath returns next when it is a path of this site, else "/".
func localPath(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/"
	}
	return next
}
