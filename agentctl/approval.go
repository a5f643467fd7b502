package agentctl

import (
	"regexp"
	"strconv"
	"sync"
)

// approvalRe is a maintainer's approval in a Jira comment: "/ymir budget +25" (USD).
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var approvalRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?m)^\s*/ymir\s+budget\s+\+([0-9]{1,5}(?:\.[0-9]{1,2})?)\s*$`)
})

// ParseApproval reads the amount a comment approves ("/ymir budget +AMOUNT" on a line of
// its own, in USD, above 0 and at most MaxCostUSD). The caller checks that its author is
// in the trigger group, and raises with Ledger.Raise, the comment's id naming it.
func ParseApproval(body string) (float64, bool) {
	m := approvalRe().FindStringSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil || v <= 0 || v > MaxCostUSD {
		return 0, false
	}
	return v, true
}
