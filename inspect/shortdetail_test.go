package inspect_test

import (
	"testing"

	"github.com/ymirflow/ymirflow/inspect"
)

// A record's JSON detail reads as key=value pairs in a table (issue 35); other text is
// kept.
func TestShortDetail(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`rebase; {"package":"glibc","reason":"CVE fix","n":3,"ok":true,"mr":null,"labels":["a", "b"]}`: `rebase; labels=["a","b"] n=3 ok=true package=glibc reason="CVE fix"`,
		`failed; {"error":""} held by w1`: `failed; error="" held by w1`,
		`no json here`:                    `no json here`,
		`broken {"a":`:                    `broken {"a":`,
		`{"a":"x"} and {"b":"y=z"}`:       `a=x and b="y=z"`,
	} {
		if got := inspect.ShortDetail(in); got != want {
			t.Errorf("ShortDetail(%q) = %q, want %q", in, got, want)
		}
	}
}
