package redact

import (
	"regexp"
	"sync"
)

// tokenPatterns are the shapes of credentials people paste into text by mistake: a
// Redactor cannot know them (they are nobody's configured secret), yet text written by
// anyone who can comment on an issue must not carry them on to an agent. Each match
// becomes Mask; for an assignment ("password: x", "token=x") only the value does.
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var tokenPatterns = sync.OnceValue(func() []*regexp.Regexp {
	return []*regexp.Regexp{
		// key = value and key: value, for names that say secret.
		regexp.MustCompile(`(?i)((?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|client[_-]?secret)["']?\s*[:=]\s*["']?)[^\s"',;]{4,}`),
		// HTTP authorisation headers and bearer tokens.
		regexp.MustCompile(`(?i)((?:authorization:\s*)?(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=-]{8,}`),
		// URLs with a password (scheme://user:password@host).
		regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]+:)[^\s@/]+(@)`),
		// Vendor tokens with a recognisable prefix: GitHub, GitLab, Slack, AWS access keys,
		// OpenAI/Anthropic-style keys, Google API keys, JWTs.
		regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|sk-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35})\b`),
		regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b`),
		// PEM private keys, whole.
		regexp.MustCompile(`(?s)-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)`),
	}
})

// Tokens returns s with credential-shaped text replaced by Mask: assignments to names
// such as password, token or api_key, bearer and basic authorisation values, passwords
// in URLs, private keys, and tokens with a vendor's prefix (GitHub, GitLab, Slack, AWS,
// JWT, ...). It is for text nobody vetted (a Jira comment handed to an agent), on top of
// a Redactor's known secrets; it errs on the side of masking.
func Tokens(s string) string {
	for _, re := range tokenPatterns() {
		if re.NumSubexp() == 0 {
			s = re.ReplaceAllString(s, Mask)
			continue
		}
		repl := "${1}" + Mask
		if re.NumSubexp() == 2 {
			repl += "${2}"
		}
		s = re.ReplaceAllString(s, repl)
	}
	return s
}
