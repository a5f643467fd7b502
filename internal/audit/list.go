package audit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Filter selects records of the trail; zero fields select all.
type Filter struct {
	Who    string    // the operator, exactly
	Action string    // the action, exactly
	Issue  string    // a canonical issue key among the record's issues
	Since  time.Time // records at or after
	// Limit is how many writes (a started record with its end, or a refusal) to return,
	// newest first. Default 100.
	Limit int
}

// scanPage is the XREVRANGE COUNT of List.
const scanPage = 500

// List returns the writes of the trail that f selects, newest first: each started record
// with the outcome and detail of its end record (still "started" while it runs, or
// when its end was not recorded), and each refusal. It reads the stream backwards in
// pages and stops at f.Since or once it has f.Limit writes.
func (l *Log) List(ctx context.Context, f Filter) ([]Record, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	since := "-"
	if !f.Since.IsZero() {
		since = strconv.FormatInt(f.Since.UnixMilli(), 10) + "-0"
	}
	out := []Record{}
	ends := map[string]Record{} // by Ref: met before (newer than) their started record
	end := "+"
	for {
		ms, err := l.rdb.XRevRangeN(ctx, l.stream, end, since, scanPage).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return out, fmt.Errorf("read %s: %w", l.stream, err)
		}
		for _, m := range ms {
			r := FromMessage(m)
			if r.Ref != "" {
				ends[r.Ref] = r
				continue
			}
			if !f.match(r) {
				continue
			}
			if e, ok := ends[r.ID]; ok {
				r.Outcome, r.Detail = e.Outcome, e.Detail
			}
			out = append(out, r)
			if len(out) >= f.Limit {
				return out, nil
			}
		}
		if len(ms) < scanPage {
			return out, nil
		}
		end = "(" + ms[len(ms)-1].ID
	}
}

func (f Filter) match(r Record) bool {
	switch {
	case f.Who != "" && r.Who != f.Who:
		return false
	case f.Action != "" && r.Action != f.Action:
		return false
	}
	if f.Issue == "" {
		return true
	}
	for _, is := range r.Issues {
		if is == f.Issue {
			return true
		}
	}
	return false
}

// FromMessage reads a record of the audit stream.
func FromMessage(m redis.XMessage) Record {
	v := func(k string) string { s, _ := m.Values[k].(string); return s }
	r := Record{ID: m.ID, Outcome: v("outcome"), Detail: v("detail"), Ref: v("ref"),
		Entry: Entry{Who: v("who"), From: v("from"), Role: v("role"), Action: v("action"), Scope: v("scope"), Reason: v("reason")}}
	if is := v("issues"); is != "" {
		r.Issues = strings.Split(is, ",")
	}
	if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			r.Time = time.UnixMilli(n).UTC()
		}
	}
	return r
}
