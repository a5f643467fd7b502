package inspect

import (
	"context"
	"fmt"
	"time"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// SlotInfo is one concurrency limit key (RUN_LIMITS) as operators see it: its slots
// used of its limit (runs, and slots handed to a waiting event whose copy has not
// started yet), and the events waiting for one (Priority of them from :todo streams).
type SlotInfo struct {
	Key           string    `json:"key"`
	Used          int64     `json:"used"`
	Limit         int64     `json:"limit"`
	Waiting       int64     `json:"waiting"`
	Priority      int64     `json:"priority"`
	OldestWaiting time.Time `json:"oldest_waiting,omitzero"`
}

// Summary is "2/2 used, 5 waiting (1 priority), oldest 40s".
func (s SlotInfo) Summary(now time.Time) string {
	out := fmt.Sprintf("%d/%d used", s.Used, s.Limit)
	if s.Waiting > 0 {
		out += fmt.Sprintf(", %d waiting", s.Waiting)
		if s.Priority > 0 {
			out += fmt.Sprintf(" (%d priority)", s.Priority)
		}
		if !s.OldestWaiting.IsZero() {
			out += ", oldest " + max(now.Sub(s.OldestWaiting), 0).Round(time.Second).String()
		}
	}
	return out
}

// Slots returns every limit key with slots used or events waiting, sorted by key. Cost:
// SCAN of the keyspace (every master's on Cluster) for the keys' records, then one
// round trip per key.
func (i *Inspector) Slots(ctx context.Context) ([]SlotInfo, error) {
	us, err := i.locker.SlotUsages(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]SlotInfo, len(us))
	for n, u := range us {
		out[n] = slotInfo(u)
	}
	return out, nil
}

func slotInfo(u lease.SlotUsage) SlotInfo {
	return SlotInfo{Key: u.Key, Used: u.Used, Limit: u.Limit, Waiting: u.Waiting, Priority: u.Priority,
		OldestWaiting: u.OldestWaiting}
}
