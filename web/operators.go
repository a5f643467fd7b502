package web

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync"
)

// Roles of the console's operators, each allowed what the one before it is, and more.
const (
	RoleViewer   = "viewer"   // reads
	RoleOperator = "operator" // and release, replay, requeue
	RoleAdmin    = "admin"    // and purge (drain all)
)

// Roles lists the roles, weakest first.
var Roles = []string{RoleViewer, RoleOperator, RoleAdmin}

func rank(role string) int {
	for i, r := range Roles {
		if r == role {
			return i
		}
	}
	return -1
}

// Operator is a named console operator: a role, and the SHA-256 of its bearer token
// (never the token itself). An operator without a hash signs in only through the
// trusted proxy's identity header (Config.ProxyUserHeader).
type Operator struct {
	Name      string
	Role      string
	TokenHash string // "sha256:<64 hex digits>"
}

// HashToken is the form a token is stored in (Operator.TokenHash). Tokens are random and
// long (`ymirflow web --new-token` makes 48 hex digits), so a plain SHA-256 cannot be reversed.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(h[:])
}

// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var operatorName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$`) })
var tokenHash = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^sha256:[0-9a-f]{64}$`) })

// ErrOperators is returned for an operators file that is not one.
var ErrOperators = errors.New("web: bad operators file")

// ParseOperators reads an operators file: one operator a line, "NAME ROLE [sha256:HEX]",
// blank lines and lines starting with # ignored. `ymirflow token NAME ROLE` prints a line.
func ParseOperators(r io.Reader) ([]Operator, error) {
	var out []Operator
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("%w: line %d: want NAME ROLE [sha256:HEX], got %d fields", ErrOperators, n, len(f))
		}
		op := Operator{Name: f[0], Role: f[1]}
		if len(f) == 3 {
			op.TokenHash = f[2]
		}
		if err := op.check(); err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrOperators, n, err)
		}
		if seen[op.Name] {
			return nil, fmt.Errorf("%w: line %d: operator %q is named twice", ErrOperators, n, op.Name)
		}
		seen[op.Name] = true
		out = append(out, op)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOperators, err)
	}
	return out, nil
}

func (op Operator) check() error {
	switch {
	case !operatorName().MatchString(op.Name):
		return fmt.Errorf("operator name %q: letters, digits and ._@+- only, at most 64", op.Name)
	case rank(op.Role) < 0:
		return fmt.Errorf("operator %s: role %q is not one of %s", op.Name, op.Role, strings.Join(Roles, ", "))
	case op.TokenHash != "" && !tokenHash().MatchString(op.TokenHash):
		return fmt.Errorf("operator %s: the token hash must be sha256: and 64 lower-case hex digits (ymirflow token prints one)", op.Name)
	}
	return nil
}

// identity is who sent a request, as the console knows them.
type identity struct {
	Name, Role string
	Via        string // bearer, session or proxy
}

// byToken finds the operator whose token is t, comparing every hash in constant time.
func (s *Server) byToken(t string) (Operator, bool) {
	if t == "" {
		return Operator{}, false
	}
	h := []byte(HashToken(t))
	var found Operator
	ok := false
	for _, op := range s.ops {
		if op.TokenHash != "" && subtle.ConstantTimeCompare(h, []byte(op.TokenHash)) == 1 {
			found, ok = op, true
		}
	}
	return found, ok
}

func (s *Server) byName(name string) (Operator, bool) {
	for _, op := range s.ops {
		if op.Name == name {
			return op, true
		}
	}
	return Operator{}, false
}

// trustedProxy reports whether r came straight from a trusted proxy.
func (s *Server) trustedProxy(r *http.Request) bool {
	if s.cfg.ProxyUserHeader == "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

// proxyUser is the identity the trusted proxy vouches for: its header's user, with the
// role the operators file gives that name, else Config.ProxyDefaultRole.
func (s *Server) proxyUser(r *http.Request) (identity, bool) {
	if !s.trustedProxy(r) {
		return identity{}, false
	}
	name := strings.TrimSpace(r.Header.Get(s.cfg.ProxyUserHeader))
	if !operatorName().MatchString(name) {
		return identity{}, false
	}
	role := s.cfg.ProxyDefaultRole
	if op, ok := s.byName(name); ok {
		role = op.Role
	}
	return identity{Name: name, Role: role, Via: "proxy"}, true
}

// who identifies r's sender: a bearer token, a session, or the trusted proxy's header.
func (s *Server) who(r *http.Request) (identity, bool) {
	if op, ok := s.byToken(bearer(r)); ok {
		return identity{Name: op.Name, Role: op.Role, Via: "bearer"}, true
	}
	if _, name, ok := s.session(r); ok {
		if op, ok := s.byName(name); ok {
			return identity{Name: op.Name, Role: op.Role, Via: "session"}, true
		}
	}
	return s.proxyUser(r)
}

// from says where r came from, for the audit trail: the console, the client's address,
// and through a trusted proxy the address it forwarded for.
func (s *Server) from(r *http.Request) string {
	f := "console " + r.RemoteAddr
	if s.trustedProxy(r) {
		if x := r.Header.Get("X-Forwarded-For"); x != "" {
			f = "console " + strings.TrimSpace(strings.Split(x, ",")[0]) + " via proxy " + r.RemoteAddr
		}
	}
	return f
}
