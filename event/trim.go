package event

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/streamid"
)

// DefaultMaxLen is the length streams are kept near by default (a setting of each
// command that appends to them; Trim does the cutting).
const DefaultMaxLen = 100_000

// Trim cuts stream down towards maxLen entries without ever removing an entry that a
// consumer group still needs: one that is pending (delivered, not acked) or not yet
// delivered. XADD MAXLEN would remove the oldest entries whatever their state, and a
// trimmed pending entry can no longer be claimed or re-run (docs/architecture.md, "Streams and
// groups"). It returns the
// number of entries removed. maxLen <= 0 never trims.
func Trim(ctx context.Context, rdb redis.UniversalClient, stream string, maxLen int64) (int64, error) {
	if maxLen <= 0 {
		return 0, nil
	}
	n, err := rdb.XLen(ctx, stream).Result()
	if err != nil || n <= maxLen {
		return 0, err
	}
	// The newest id that may go: the last of the oldest (n - maxLen) entries.
	excess := n - maxLen
	old, err := rdb.XRangeN(ctx, stream, "-", "+", excess).Result()
	if err != nil || len(old) == 0 {
		return 0, err
	}
	cut := old[len(old)-1].ID
	floor, err := keepFloor(ctx, rdb, stream)
	if err != nil {
		return 0, err
	}
	// MINID keeps ids >= minID; we drop ids <= cut, and nothing at or above floor.
	minID := nextID(cut)
	if floor != "" && streamid.Compare(floor, minID) < 0 {
		minID = floor
	}
	return rdb.XTrimMinIDApprox(ctx, stream, minID, 0).Result()
}

// keepFloor is the oldest id some group still needs: its oldest pending entry, or the
// first entry after its last-delivered id; the first entry when no group exists yet.
func keepFloor(ctx context.Context, rdb redis.UniversalClient, stream string) (string, error) {
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return "", nil
		}
		return "", fmt.Errorf("trim %s: %w", stream, err)
	}
	floor := ""
	lower := func(id string) {
		if floor == "" || streamid.Compare(id, floor) < 0 {
			floor = id
		}
	}
	if len(groups) == 0 {
		// Nobody has read it yet (the fetcher can run before the first worker creates
		// the group): every entry is still to be delivered.
		first, err := rdb.XRangeN(ctx, stream, "-", "+", 1).Result()
		if err != nil || len(first) == 0 {
			return "", err
		}
		return first[0].ID, nil
	}
	for _, g := range groups {
		lower(nextID(g.LastDeliveredID))
		if g.Pending == 0 {
			continue
		}
		p, err := rdb.XPending(ctx, stream, g.Name).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return "", fmt.Errorf("trim %s: pending of %s: %w", stream, g.Name, err)
		}
		if p != nil && p.Lower != "" {
			lower(p.Lower)
		}
	}
	return floor, nil
}

// nextID is the smallest id after id.
func nextID(id string) string {
	p, _ := streamid.Parse(id)
	return p.Next().String()
}
