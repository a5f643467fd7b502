package inspect

import (
	"context"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/streamid"
)

// Outcomes counts the records of the results stream per time bucket and event type
// (stage.done, stage.failed, lock.dropped, ...): the pipeline's throughput.
type Outcomes struct {
	Since  time.Time `json:"since"`
	Bucket string    `json:"bucket"` // a Go duration, e.g. "1m0s"
	// Types are the event types seen, sorted; Buckets the counts, oldest first, one per
	// bucket from Since to now (empty buckets included).
	Types   []string        `json:"types"`
	Buckets []OutcomeBucket `json:"buckets"`
	Total   int64           `json:"total"`
}

// OutcomeBucket is one bucket of Outcomes.
type OutcomeBucket struct {
	Start  time.Time        `json:"start"`
	Counts map[string]int64 `json:"counts"`
	Total  int64            `json:"total"`
}

// Outcomes counts the results records from now-window to now in buckets of bucket.
//
// Cost: one XRANGE round trip per PageSize records of the window (the stream ids give
// the times, so only the window is read).
func (in *Inspector) Outcomes(ctx context.Context, window, bucket time.Duration) (Outcomes, error) {
	now := in.now()
	if bucket <= 0 {
		bucket = time.Minute
	}
	since := now.Add(-window).Truncate(bucket)
	n := int(now.Sub(since)/bucket) + 1
	out := Outcomes{Since: since, Bucket: bucket.String(), Types: []string{}, Buckets: make([]OutcomeBucket, n)}
	for i := range out.Buckets {
		out.Buckets[i] = OutcomeBucket{Start: since.Add(time.Duration(i) * bucket), Counts: map[string]int64{}}
	}
	seen := map[string]bool{}
	err := in.scan(ctx, 1, func(int) string { return in.topo.Results() }, TimeID(since), "+", func(_ int, m redis.XMessage) {
		i := int(streamid.Time(m.ID).Sub(since) / bucket)
		if i < 0 || i >= n {
			return
		}
		t := fieldStr(m.Values["event_type"])
		if t == "" {
			t = "other"
		}
		if !seen[t] {
			seen[t] = true
			out.Types = append(out.Types, t)
		}
		out.Buckets[i].Counts[t]++
		out.Buckets[i].Total++
		out.Total++
	})
	sort.Strings(out.Types)
	return out, err
}
