// Package redact is the one place where ymirflow's secrets are taken out of text that
// leaves the process: Jira comments, the results and dead-letter streams, logs and the
// CLI's output all go through a Redactor.
//
// A Redactor knows secret values, not patterns: ymirflow's own (the Redis password, the
// Jira token or token-file content) and those of the variables handed to agents whose
// names look secret (see SecretName). Every occurrence of such a value, raw or as it
// appears inside a JSON string, becomes "[redacted]".
package redact

import (
	"encoding/json"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// Mask replaces every secret value.
const Mask = "[redacted]"

// MinLen is the shortest value treated as a secret: replacing every "1" or "ab" in a log
// would destroy it and protect nothing.
const MinLen = 4

// Redactor replaces known secret values. The zero value and nil redact nothing; it is
// safe for concurrent use.
type Redactor struct {
	mu      sync.RWMutex
	secrets []string
	r       *strings.Replacer
}

// New returns a Redactor of secrets (values shorter than MinLen are ignored).
func New(secrets ...string) *Redactor {
	r := &Redactor{}
	r.Add(secrets...)
	return r
}

// Add makes more values secret (a rotated token, say).
func (r *Redactor) Add(secrets ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range secrets {
		for _, form := range forms(s) {
			if len(form) >= MinLen && !slices.Contains(r.secrets, form) {
				r.secrets = append(r.secrets, form)
			}
		}
	}
	// Longest first, so a secret containing another is replaced whole.
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(r.secrets))
	for _, s := range r.secrets {
		pairs = append(pairs, s, Mask)
	}
	r.r = strings.NewReplacer(pairs...)
}

// forms are the spellings of s that text may hold: raw, and escaped inside a JSON string
// (a structured log line, a JSON detail), with and without HTML escaping, and
// percent-encoded (inside a URL).
func forms(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	out := []string{s, url.QueryEscape(s), url.PathEscape(s)}
	if b, err := json.Marshal(s); err == nil {
		out = append(out, string(b[1:len(b)-1]))
	}
	var sb strings.Builder
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if enc.Encode(s) == nil {
		e := strings.TrimSpace(sb.String())
		out = append(out, e[1:len(e)-1])
	}
	return out
}

// Len is the number of secret spellings known.
func (r *Redactor) Len() int {
	if r == nil {
		return 0
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.secrets)
}

// String returns s with every secret value replaced by Mask.
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	r.mu.RLock()
	rep := r.r
	r.mu.RUnlock()
	if rep == nil {
		return s
	}
	return rep.Replace(s)
}

// Bytes is String on bytes.
func (r *Redactor) Bytes(b []byte) []byte {
	if r.Len() == 0 {
		return b
	}
	return []byte(r.String(string(b)))
}

// Writer returns a writer that redacts each write before passing it to w. It suits
// writers that receive whole records per write (zerolog writes each line at once);
// a secret split across two writes is not seen.
func (r *Redactor) Writer(w io.Writer) io.Writer { return writer{r: r, w: w} }

type writer struct {
	r *Redactor
	w io.Writer
}

// Unwrap returns the writer redacted into (so callers can still tell a terminal).
func (w writer) Unwrap() io.Writer { return w.w }

func (w writer) Write(p []byte) (int, error) {
	if w.r.Len() == 0 {
		return w.w.Write(p)
	}
	if _, err := w.w.Write(w.r.Bytes(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// secretWords make a variable name look secret (matched anywhere in the upper-cased name).
var secretWords = []string{"TOKEN", "PASSWORD", "PASSWD", "SECRET", "KEY", "CREDENTIAL"}

// SecretName reports whether an environment variable's name looks like it holds a secret
// (*TOKEN*, *PASSWORD*, *SECRET*, *KEY*, *CREDENTIAL*).
func SecretName(name string) bool {
	u := strings.ToUpper(name)
	for _, w := range secretWords {
		if strings.Contains(u, w) {
			return true
		}
	}
	return false
}

// URL returns raw with its password, and the value of every query parameter whose name
// looks secret (password=, token=, ...), replaced by "xxxxx". Text that does not parse as
// a URL is never returned: it may hold a password anywhere.
func URL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Scheme == "" {
		return "<unparseable URL>"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			u.RawQuery = "xxxxx"
		} else {
			for k := range q {
				if SecretName(k) || strings.Contains(strings.ToUpper(k), "PASS") || strings.EqualFold(k, "auth") {
					for i := range q[k] {
						q[k][i] = "xxxxx"
					}
				}
			}
			u.RawQuery = q.Encode()
		}
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}
