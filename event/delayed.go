package event

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Delayed events (the busy policy delay): an event whose issue is busy is acked and
// kept in its stream's delayed set, a sorted set scored by the time (ms) it is due;
// Promote appends the due ones to the stream again, each once, removing it in the same
// step: nothing is lost between them, and nothing is appended twice. The set lives in the
// stream's hash slot.

// Metadata the delay policy writes on the event it re-queues.
const (
	// MetaDelays counts how often the event was delayed (the policy doubles its wait
	// each time).
	MetaDelays = "delays"
	// MetaDelayedFrom is the stream id of the entry it was delayed from.
	MetaDelayedFrom = "delayed_from"
)

// LockDelayed is the results stream record of an event re-queued by the delay policy.
const LockDelayed = "lock.delayed"

// DelayedKey is the delayed set of stream: "{<stream>}:delayed", in the stream's hash
// slot on Redis Cluster (a key whose tag is the whole name of another hashes like it);
// a stream that carries a hash tag of its own shares it with "<stream>:delayed".
func DelayedKey(stream string) string {
	if i := strings.IndexByte(stream, '{'); i >= 0 && strings.IndexByte(stream[i:], '}') > 1 {
		return stream + ":delayed"
	}
	return "{" + stream + "}:delayed"
}

// delayedMember is one member of a delayed set: the entry it was delayed from and the
// fields of the entry to append. Its JSON is the member, deterministic for one event
// (encoding/json sorts map keys), so a ZADD sent twice (a lost reply, a redelivery)
// keeps one member.
type delayedMember struct {
	From   string            `json:"from"`
	Fields map[string]string `json:"fields"`
}

// DelayedMember is the member that keeps fields (an entry's fields, as Encode gives
// them) delayed, from entry id from. Values are written as strings.
func DelayedMember(from string, fields map[string]any) (string, error) {
	m := delayedMember{From: from, Fields: make(map[string]string, len(fields))}
	for k, v := range fields {
		switch x := v.(type) {
		case string:
			m.Fields[k] = x
		case []byte:
			m.Fields[k] = string(x)
		default:
			m.Fields[k] = fmt.Sprint(x)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("event: delayed member: %w", err)
	}
	return string(b), nil
}

//go:embed scripts/due.lua
var dueLua string

var dueScript = redis.NewScript(dueLua)

//go:embed scripts/now.lua
var nowLua string

var nowScript = redis.NewScript(nowLua)

// DelayedNow is the server's clock as the promoter of stream's delayed set reads it
// (scripts/due.lua), read on the set's node: a delay's due time is this plus the wait,
// so a worker whose clock is off makes nothing due early or late. One round trip.
func DelayedNow(ctx context.Context, rdb redis.Scripter, stream string) (time.Time, error) {
	ms, err := nowScript.Run(ctx, rdb, []string{DelayedKey(stream)}).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("event: read the server's clock for %s: %w", stream, err)
	}
	return time.UnixMilli(ms), nil
}

// PromoteBatch bounds the entries one Promote moves.
const PromoteBatch = 100

// Promote appends the due events of stream's delayed set to stream and removes them
// from the set. Due is by the server's clock (scripts/due.lua). Each append removes its
// member in the same atomic step (internal/xonce, by an id taken from the member, and
// filed in the issue's index like every append): a crash, a lost reply or a second
// worker promoting the same member at once appends nothing twice, however late the
// promotion resumes, and a member is removed only with its entry's append, so nothing
// is lost. It returns how many it moved and
// when the next one is due (the zero Time if none is waiting).
func Promote(ctx context.Context, rdb redis.UniversalClient, stream string) (int, time.Time, error) {
	key := DelayedKey(stream)
	res, err := dueScript.Run(ctx, rdb, []string{key}, PromoteBatch).Slice()
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("event: promote delayed events of %s: %w", stream, err)
	}
	if len(res) < 1 {
		return 0, time.Time{}, fmt.Errorf("event: promote %s: unexpected reply %v", stream, res)
	}
	var next time.Time
	if s, ok := res[0].(string); ok && s != "" {
		if ms, err := strconv.ParseFloat(s, 64); err == nil {
			next = time.UnixMilli(int64(ms))
		}
	}
	moved := 0
	for _, r := range res[1:] {
		member, _ := r.(string)
		if err := promoteOne(ctx, rdb, stream, key, member); err != nil {
			return moved, next, err
		}
		moved++
	}
	return moved, next, nil
}

// promoteOne appends member's event to stream, taking the member from the delayed set
// key in the same step (xonce.Append.TakeSet), so no member outlives its append, however
// long after a crash the promotion resumes. A member it cannot read is removed.
func promoteOne(ctx context.Context, rdb redis.UniversalClient, stream, key, member string) error {
	var m delayedMember
	if json.Unmarshal([]byte(member), &m) != nil || len(m.Fields) == 0 {
		if err := rdb.ZRem(ctx, key, member).Err(); err != nil {
			return fmt.Errorf("event: drop an unreadable delayed member of %s: %w", stream, err)
		}
		return nil
	}
	values := make(map[string]any, len(m.Fields))
	for k, v := range m.Fields {
		values[k] = v
	}
	sum := sha1.Sum([]byte(member))
	if _, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "delayed-" + hex.EncodeToString(sum[:]),
		Values: values, Issue: IndexIssue(m.Fields[metaPrefix+MetaIssueKey]), TakeSet: key, TakeMember: member}); err != nil {
		return fmt.Errorf("event: promote a delayed event of %s: %w", stream, err)
	}
	return nil
}

// DelayedEvent is one event waiting in a delayed set, for the operators' views.
type DelayedEvent struct {
	Stream      string    `json:"stream"`
	From        string    `json:"from"` // the entry it was delayed from
	Until       time.Time `json:"delayed_until"`
	IssueKey    string    `json:"issue_key"`
	EventType   string    `json:"event_type"`
	Correlation string    `json:"correlation_id"`
	Attempt     string    `json:"attempt"`
	Delays      int       `json:"delays"`
}

// ListDelayed returns the events waiting in stream's delayed set, soonest first, at
// most limit (all when limit <= 0). One round trip.
func ListDelayed(ctx context.Context, rdb redis.Cmdable, stream string, limit int64) ([]DelayedEvent, error) {
	zs, err := QueueListDelayed(ctx, rdb, stream, limit).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("event: list delayed events of %s: %w", stream, err)
	}
	return DecodeDelayed(stream, zs), nil
}

// QueueListDelayed queues the read of ListDelayed on rdb (a pipeline, say); decode its
// reply with DecodeDelayed.
func QueueListDelayed(ctx context.Context, rdb redis.Cmdable, stream string, limit int64) *redis.ZSliceCmd {
	stop := limit - 1
	if limit <= 0 {
		stop = -1
	}
	return rdb.ZRangeWithScores(ctx, DelayedKey(stream), 0, stop)
}

// DecodeDelayed reads a delayed set's members (ZRANGE WITHSCORES) as DelayedEvents;
// members it cannot read are skipped.
func DecodeDelayed(stream string, zs []redis.Z) []DelayedEvent {
	out := make([]DelayedEvent, 0, len(zs))
	for _, z := range zs {
		s, _ := z.Member.(string)
		var m delayedMember
		if json.Unmarshal([]byte(s), &m) != nil {
			continue
		}
		d := DelayedEvent{Stream: stream, From: m.From, Until: time.UnixMilli(int64(z.Score)),
			IssueKey: m.Fields[metaPrefix+MetaIssueKey], EventType: m.Fields[metaPrefix+MetaEventType],
			Correlation: m.Fields[metaPrefix+MetaCorrelationID], Attempt: m.Fields[metaPrefix+MetaAttempt]}
		d.Delays, _ = strconv.Atoi(m.Fields[metaPrefix+MetaDelays])
		out = append(out, d)
	}
	return out
}
