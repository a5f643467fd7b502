package redact_test

import (
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// TestTokens: credential-shaped text in untrusted text (a Jira comment) is masked, the
// words around it are kept, and ordinary prose is left alone.
func TestTokens(t *testing.T) {
	t.Parallel()
	for in, secret := range map[string]string{
		"the password: hunter2hunter and more":                                   "hunter2hunter",
		`use TOKEN="abcd1234efgh" please`:                                        "abcd1234efgh",
		"api_key=ZZZ999yyyXXX, then":                                             "ZZZ999yyyXXX",
		"curl -H 'Authorization: Bearer eyAbc123.def456'":                        "eyAbc123.def456",
		"clone https://bob:pa55w0rd@git.example.com/x":                           "pa55w0rd",
		"my token ghp_0123456789abcdefghijABCDEFGHIJ ok":                         "ghp_0123456789abcdefghijABCDEFGHIJ",
		"gitlab glpat-abcdefghij0123456789 here":                                 "glpat-abcdefghij0123456789",
		"aws AKIAABCDEFGHIJKLMNOP key":                                           "AKIAABCDEFGHIJKLMNOP",
		"jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4 end":           "SflKxwRJSMeKKF2QT4",
		"-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----": "MIIEow",
	} {
		out := redact.Tokens(in)
		if strings.Contains(out, secret) || !strings.Contains(out, redact.Mask) {
			t.Errorf("%q → %q", in, out)
		}
	}
	for _, in := range []string{
		"also update the tests, and the token bucket docs",
		"the password field of the form must be required",
		"see https://example.com/a:b and RHEL-1234",
	} {
		if out := redact.Tokens(in); out != in {
			t.Errorf("prose changed: %q → %q", in, out)
		}
	}
	if out := redact.Tokens("keep: password=hunter22 here"); !strings.HasPrefix(out, "keep: password=") || !strings.HasSuffix(out, " here") {
		t.Errorf("the name of an assignment is kept: %q", out)
	}
}
