package agentctl

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The validators accept exactly what the counted patterns they replace accepted (the
// lengths checked apart, so that the patterns stay small to compile).
func TestValidatorsMatchTheCountedPatterns(t *testing.T) {
	model := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,99}$`)
	upstream := regexp.MustCompile(`^(jira|gitlab|llm:[A-Za-z0-9][A-Za-z0-9._:/@-]{0,99})$`)
	id := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
	const alphabet = "aZ09._:/@- \n\x00é"
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := []string{"", "jira", "gitlab", "llm:", "llm:x", "llm:-x", "llm:" + strings.Repeat("a", 100), "llm:" + strings.Repeat("a", 101),
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 100), strings.Repeat("a", 101), "jira\n", "llm:a\n"}
	for range 20000 {
		var b strings.Builder
		if rng.IntN(3) == 0 {
			b.WriteString("llm:")
		}
		for n := rng.IntN(110); n > 0; n-- {
			r := []rune(alphabet)
			b.WriteRune(r[rng.IntN(len(r))])
		}
		inputs = append(inputs, b.String())
	}
	for _, s := range inputs {
		if got, want := validModel(s), model.MatchString(s); got != want {
			t.Errorf("validModel(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := validUpstream(s), upstream.MatchString(s); got != want {
			t.Errorf("validUpstream(%q) = %v, the pattern says %v", s, got, want)
		}
		if got, want := validID(s), id.MatchString(s); got != want {
			t.Errorf("validID(%q) = %v, the pattern says %v", s, got, want)
		}
	}
}
