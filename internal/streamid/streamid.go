// Package streamid reads Redis stream entry ids ("<ms>-<seq>"): parsing, ordering, and
// the time an id encodes. It is the one Go home of these rules; the fetcher's queued
// marker script (fetcher/scripts/publish.lua, function idgt) mirrors Compare in Lua
// because it must decide inside Redis.
//
// It imports the standard library only, so every layer may use it (lockmw included).
package streamid

import (
	"strconv"
	"strings"
	"time"
)

// ID is a parsed stream entry id: the server's milliseconds and a sequence number
// within them.
type ID struct{ MS, Seq uint64 }

// Parse parses "ms-seq", or "ms" alone (as XRANGE takes a bound; Seq is then 0).
// ok is false for anything else.
func Parse(s string) (id ID, ok bool) {
	a, b, hasSeq := strings.Cut(s, "-")
	ms, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return ID{}, false
	}
	var seq uint64
	if hasSeq {
		if seq, err = strconv.ParseUint(b, 10, 64); err != nil {
			return ID{}, false
		}
	}
	return ID{MS: ms, Seq: seq}, true
}

// ParseFull parses the full form "ms-seq" only, as Redis returns ids of entries.
func ParseFull(s string) (ID, bool) {
	if !strings.Contains(s, "-") {
		return ID{}, false
	}
	return Parse(s)
}

// Compare orders a and b: -1, 0 or +1.
func (a ID) Compare(b ID) int {
	switch {
	case a.MS < b.MS:
		return -1
	case a.MS > b.MS:
		return 1
	case a.Seq < b.Seq:
		return -1
	case a.Seq > b.Seq:
		return 1
	}
	return 0
}

// After reports whether a comes after b in a stream.
func (a ID) After(b ID) bool { return a.Compare(b) > 0 }

// Next is the smallest id after id (the exclusive bound of a range starting past id).
func (id ID) Next() ID { return ID{MS: id.MS, Seq: id.Seq + 1} }

// Time is when the entry was added, by the server's clock (millisecond precision).
func (id ID) Time() time.Time { return time.UnixMilli(int64(id.MS)) }

// String is the full form "ms-seq".
func (id ID) String() string {
	return strconv.FormatUint(id.MS, 10) + "-" + strconv.FormatUint(id.Seq, 10)
}

// Compare orders two ids given as strings; a string that is not an id sorts as 0-0,
// before every entry.
func Compare(a, b string) int {
	ia, _ := Parse(a)
	ib, _ := Parse(b)
	return ia.Compare(ib)
}

// Time is the time encoded in an id given as a string; zero when s is not an id.
func Time(s string) time.Time {
	id, ok := Parse(s)
	if !ok {
		return time.Time{}
	}
	return id.Time()
}
