package agentctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// AskOnce reports whether this is the first time issue's exhausted budget is asked to
// be raised at its current level (once per raise: after an approval, a new exhaustion
// asks again). The mark is taken before the comment is posted: a crash in between
// loses the comment rather than posting it twice (the park label stays).
func (l *Ledger) AskOnce(ctx context.Context, issue string) (bool, error) {
	ledger := l.key(issue, "ledger")
	raised, err := l.rdb.HGet(ctx, ledger, "raised").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("agentctl: read the raises of %s: %w", issue, err)
	}
	ok, err := l.rdb.HSetNX(ctx, ledger, "asked:"+strconv.FormatInt(raised, 10), "1").Result()
	if err != nil {
		return false, fmt.Errorf("agentctl: mark the budget request of %s: %w", issue, err)
	}
	return ok, nil
}

// Parked is a request whose run ended for its budget, kept to be published again when
// the budget is raised.
type Parked struct {
	Agent     string `json:"agent"`
	Stream    string `json:"stream"`
	EventType string `json:"event_type"`
	Payload   []byte `json:"payload"`
}

// Park keeps p until issue's budget is raised (one per agent: the newest).
func (l *Ledger) Park(ctx context.Context, issue string, p Parked) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := l.rdb.HSet(ctx, l.key(issue, "parked"), p.Agent, b).Err(); err != nil {
		return fmt.Errorf("agentctl: park %s of %s: %w", p.Agent, issue, err)
	}
	return nil
}

// TakeParked returns and forgets issue's parked requests (to publish them again).
func (l *Ledger) TakeParked(ctx context.Context, issue string) ([]Parked, error) {
	key := l.key(issue, "parked")
	all, err := l.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("agentctl: read the parked requests of %s: %w", issue, err)
	}
	out := make([]Parked, 0, len(all))
	for agent, v := range all {
		var p Parked
		if json.Unmarshal([]byte(v), &p) != nil {
			continue
		}
		// Taken one by one: HDEL returns 1 for whoever takes it first.
		if n, err := l.rdb.HDel(ctx, key, agent).Result(); err != nil || n == 0 {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}
