package fakejira

import (
	"math/rand/v2"
	"time"
)

// SampleIssue returns one sample issue of kind with the key RHEL-<num>, shaped exactly as
// SampleIssues shapes that kind; its package and fix version are drawn from seed and num.
// Timestamps are relative to the current time. The demo builds its scenarios from it.
func SampleIssue(kind SampleKind, num int, seed int64) Issue {
	r := rand.New(rand.NewPCG(uint64(seed), uint64(num)))
	return sampleIssue(kind, num, r, time.Now().UTC().Truncate(time.Millisecond))
}
