// Package xonce appends to Redis streams so that an append sent twice adds one entry.
//
// go-redis sends a command again when its connection fails before the reply arrives
// (Options.MaxRetries). For a read or a compare-and-delete that is harmless; for XADD
// it is a second record: two outcome records of one run, two downstream requests. Each
// append here carries an id chosen by the caller before the first try, and a small
// marker key (in the stream's hash slot, so it works on Redis Cluster) remembers
// which entry that id made. A repeat finds the marker and returns the same entry id.
package xonce

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed xadd_once.lua
var xaddOnceLua string

// IndexLua is the issue-index step in Lua (index_keys and index_entry, the part of
// xadd_once.lua before its line "-- end of the index step"), for scripts of other
// packages that append an entry themselves (the lease's release of a queued
// follow-up): put before them, it files their entries exactly as Run does.
var IndexLua = xaddOnceLua[:strings.Index(xaddOnceLua, "-- end of the index step")]

var xaddOnce = redis.NewScript(xaddOnceLua)

// DefaultTTL is how long a repeat of an append is recognised when Append.TTL is zero:
// far longer than go-redis's retries (about a second) and than a crashed worker's entry
// takes to be redelivered.
const DefaultTTL = time.Hour

// ErrLeaseLost is returned when Append.Lock no longer holds Append.Token.
var ErrLeaseLost = errors.New("xonce: lease is no longer held")

// Append is one append to a stream.
type Append struct {
	// Stream receives the entry.
	Stream string
	// ID names this append: a repeat with the same ID within TTL adds nothing. Pick it
	// before the first try (a random token, or the id of what the append records).
	// Required.
	ID string
	// Values are the entry's fields.
	Values map[string]any
	// MaxLen trims the stream approximately; 0 does not trim. Default 0.
	MaxLen int64
	// TTL is how long a repeat is recognised. Default DefaultTTL.
	TTL time.Duration
	// Lock and Token, when set, make the append fenced: it is refused with
	// ErrLeaseLost unless Lock, and each of Locks, holds Token. The lock keys must be
	// on the stream's node (standalone Redis). Default: no check.
	Lock, Token string
	// Locks are further lock keys the append is fenced by, with Lock and Token (a
	// lease's shared keys). Default: none.
	Locks []string
	// AckStream, AckGroup and AckID, when set, XACK that entry in the same atomic step
	// (standalone Redis: the ack stream must be on the same node), and AckDelete also
	// XDELs it. Default: no ack.
	AckStream, AckGroup, AckID string
	AckDelete                  bool
	// Issue, when set, records the new entry in the issue's index of the stream
	// (IndexKey) in the same atomic step, so that readers find an issue's entries
	// without scanning the stream. It is the canonical issue key. Default: the issue
	// of ctx (WithIssue), else no index.
	Issue string
	// TakeSet and TakeMember, when set, make the append take that member of a sorted
	// set in the stream's hash slot: it is made only while the member is there, and
	// removes it in the same atomic step. Nothing can then stand between an append and
	// the removal of what it appended, so a repeat long after the marker expired (a
	// promoter that died in between and resumed hours later) appends nothing. Run
	// returns "" when the member was gone (someone else appended it). Default: none.
	TakeSet, TakeMember string
}

// Index bounds: an issue's index of one stream keeps its newest IndexMax entry ids,
// none older than the stream's first entry (each write drops what a trim of the stream
// cut), and expires IndexTTL after its last write.
const (
	IndexMax = 1000
	IndexTTL = 30 * 24 * time.Hour
)

type issueKey struct{}

// WithIssue returns ctx naming the issue that appends made under it are about: Run
// indexes them (Append.Issue) when the Append names none. For appends made by code
// that takes no issue of its own, such as a lease's fenced XADD.
func WithIssue(ctx context.Context, issue string) context.Context {
	return context.WithValue(ctx, issueKey{}, issue)
}

func issueFrom(ctx context.Context) string {
	s, _ := ctx.Value(issueKey{}).(string)
	return s
}

// tag is the hash-tag prefix of stream's slot: the stream itself when its name has a
// hash tag, else the whole name in braces.
func tag(stream string) string {
	if i := strings.IndexByte(stream, '{'); i >= 0 {
		if j := strings.IndexByte(stream[i+1:], '}'); j > 0 {
			return stream
		}
	}
	return "{" + stream + "}"
}

// IndexKey is the key of issue's index of stream: a sorted set of the stream ids of the
// entries about issue, scored by their millisecond, in the stream's hash slot. Members
// are "<ms>-<seq>" with the sequence in 10 digits, so that the ids of one millisecond
// sort in order; IndexID turns one back into a stream id.
func IndexKey(stream, issue string) string { return tag(stream) + ":issue:" + issue }

// IndexID is the stream id of a member of an index (IndexKey): "1-0000000002" is "1-2".
func IndexID(member string) string {
	ms, seq, ok := strings.Cut(member, "-")
	if !ok {
		return member
	}
	if t := strings.TrimLeft(seq, "0"); t != "" {
		return ms + "-" + t
	}
	return ms + "-0"
}

// IndexSinceKey holds the first id ever indexed in stream: entries before it were
// written before the index existed (or by writers that do not index).
func IndexSinceKey(stream string) string { return tag(stream) + ":issue-index-since" }

// MarkerKey is the key that remembers the append id of stream: in the stream's hash
// slot (the stream's own hash tag if it has one, else the whole name as the tag).
func MarkerKey(stream, id string) string { return tag(stream) + ":once:" + id }

func (a Append) keysArgs() ([]string, []any) {
	keys := []string{a.Stream, MarkerKey(a.Stream, a.ID), IndexKey(a.Stream, a.Issue), IndexSinceKey(a.Stream)}
	locks := 0
	if a.Token != "" {
		keys = append(append(keys, a.Lock), a.Locks...)
		locks = 1 + len(a.Locks)
	}
	if a.AckGroup != "" {
		keys = append(keys, a.AckStream)
	}
	if a.TakeMember != "" {
		keys = append(keys, a.TakeSet)
	}
	ttl := a.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	del := ""
	if a.AckDelete {
		del = "1"
	}
	args := make([]any, 0, 11+2*len(a.Values))
	args = append(args, a.MaxLen, ttl.Milliseconds(), a.Token, a.AckGroup, a.AckID, del,
		a.Issue, IndexMax, IndexTTL.Milliseconds(), a.TakeMember, locks)
	for k, v := range a.Values {
		args = append(args, k, v)
	}
	return keys, args
}

// Run appends (EVALSHA, EVAL if the server lost the script) and returns the entry's
// id: the new entry's, or the first one's when this append id was seen before.
func Run(ctx context.Context, c redis.Scripter, a Append) (string, error) {
	if a.ID == "" {
		return "", errors.New("xonce: Append.ID is empty")
	}
	if a.Issue == "" {
		a.Issue = issueFrom(ctx)
	}
	keys, args := a.keysArgs()
	return result(xaddOnce.Run(ctx, c, keys, args...))
}

// Queue adds the append to pipe (by EVAL, which a server without the script cache
// still runs) and returns its command: its value after Exec is the entry's id.
func Queue(ctx context.Context, pipe redis.Pipeliner, a Append) *redis.Cmd {
	if a.Issue == "" {
		a.Issue = issueFrom(ctx)
	}
	keys, args := a.keysArgs()
	return xaddOnce.Eval(ctx, pipe, keys, args...)
}

func result(cmd *redis.Cmd) (string, error) {
	id, err := cmd.Text()
	if err != nil && strings.HasPrefix(err.Error(), "LEASELOST") {
		return "", ErrLeaseLost
	}
	return id, err
}

// NewID returns a random append id, for an append that names nothing else: a repeat of
// the same call (go-redis's retry) is then recognised, a new call is a new append.
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
