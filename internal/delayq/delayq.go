package delayq

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

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Key is the delayed set of stream: "{<stream>}:delayed", in the stream's hash
// slot on Redis Cluster (a key whose tag is the whole name of another hashes like it);
// a stream that carries a hash tag of its own shares it with "<stream>:delayed".
func Key(stream string) string {
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

// Member is the member that keeps fields (an entry's fields, as Encode gives
// them) delayed, from entry id from. Values are written as strings.
func Member(from string, fields map[string]any) (string, error) {
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
		return "", fmt.Errorf("delayq: delayed member: %w", err)
	}
	return string(b), nil
}

//go:embed scripts/due.lua
var dueLua string

var dueScript = redis.NewScript(dueLua)

//go:embed scripts/now.lua
var nowLua string

var nowScript = redis.NewScript(nowLua)

// Now is the server's clock as the promoter of stream's delayed set reads it
// (scripts/due.lua), read on the set's node: a delay's due time is this plus the wait,
// so a worker whose clock is off makes nothing due early or late. One round trip.
func Now(ctx context.Context, rdb redis.Scripter, stream string) (time.Time, error) {
	ms, err := nowScript.Run(ctx, rdb, []string{Key(stream)}).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("delayq: read the server's clock for %s: %w", stream, err)
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
	key := Key(stream)
	res, err := dueScript.Run(ctx, rdb, []string{key}, PromoteBatch).Slice()
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("delayq: promote delayed events of %s: %w", stream, err)
	}
	if len(res) < 1 {
		return 0, time.Time{}, fmt.Errorf("delayq: promote %s: unexpected reply %v", stream, res)
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
			return fmt.Errorf("delayq: drop an unreadable delayed member of %s: %w", stream, err)
		}
		return nil
	}
	values := make(map[string]any, len(m.Fields))
	for k, v := range m.Fields {
		values[k] = v
	}
	sum := sha1.Sum([]byte(member))
	if _, err := xonce.Run(ctx, rdb, xonce.Append{Stream: stream, ID: "delayed-" + hex.EncodeToString(sum[:]),
		Values: values, Issue: event.IndexIssue(m.Fields[event.MetaPrefix+event.MetaIssueKey]), TakeSet: key, TakeMember: member}); err != nil {
		return fmt.Errorf("delayq: promote a delayed event of %s: %w", stream, err)
	}
	return nil
}

// Event is one event waiting in a delayed set, for the operators' views.
type Event struct {
	Stream      string    `json:"stream"`
	From        string    `json:"from"` // the entry it was delayed from
	Until       time.Time `json:"delayed_until"`
	IssueKey    string    `json:"issue_key"`
	EventType   string    `json:"event_type"`
	Correlation string    `json:"correlation_id"`
	Attempt     string    `json:"attempt"`
	Delays      int       `json:"delays"`
}

// List returns the events waiting in stream's delayed set, soonest first, at
// most limit (all when limit <= 0). One round trip.
func List(ctx context.Context, rdb redis.Cmdable, stream string, limit int64) ([]Event, error) {
	zs, err := QueueList(ctx, rdb, stream, limit).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("delayq: list delayed events of %s: %w", stream, err)
	}
	return Decode(stream, zs), nil
}

// QueueList queues the read of List on rdb (a pipeline, say); decode its
// reply with Decode.
func QueueList(ctx context.Context, rdb redis.Cmdable, stream string, limit int64) *redis.ZSliceCmd {
	stop := limit - 1
	if limit <= 0 {
		stop = -1
	}
	return rdb.ZRangeWithScores(ctx, Key(stream), 0, stop)
}

// Decode reads a delayed set's members (ZRANGE WITHSCORES) as DelayedEvents;
// members it cannot read are skipped.
func Decode(stream string, zs []redis.Z) []Event {
	out := make([]Event, 0, len(zs))
	for _, z := range zs {
		s, _ := z.Member.(string)
		var m delayedMember
		if json.Unmarshal([]byte(s), &m) != nil {
			continue
		}
		d := Event{Stream: stream, From: m.From, Until: time.UnixMilli(int64(z.Score)),
			IssueKey: m.Fields[event.MetaPrefix+event.MetaIssueKey], EventType: m.Fields[event.MetaPrefix+event.MetaEventType],
			Correlation: m.Fields[event.MetaPrefix+event.MetaCorrelationID], Attempt: m.Fields[event.MetaPrefix+event.MetaAttempt]}
		d.Delays, _ = strconv.Atoi(m.Fields[event.MetaPrefix+event.MetaDelays])
		out = append(out, d)
	}
	return out
}
