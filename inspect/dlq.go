package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/streamid"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// DeadLetter is one entry of the dead-letter stream.
type DeadLetter struct {
	ID   string    `json:"id"`
	Time time.Time `json:"time"` // of the id: when it was buried
	// Stream and OriginalID are where the event was read from (dead_stream, dead_id);
	// Requeue publishes it back to Stream.
	Stream     string `json:"stream"`
	OriginalID string `json:"original_id"`
	Error      string `json:"error"`
	Attempts   int    `json:"attempts"`
	Agent      string `json:"agent"`
	Issue      string `json:"issue"`
	EventType  string `json:"event_type"`
	UUID       string `json:"uuid"`
	// CorrelationID of the event; Metadata all of its metadata; Payload its payload.
	CorrelationID string            `json:"correlation_id,omitempty"`
	Metadata      map[string]string `json:"metadata"`
	Payload       string            `json:"payload"`
}

func (in *Inspector) deadLetter(m redis.XMessage) DeadLetter {
	v := func(k string) string { return fieldStr(m.Values[k]) }
	d := DeadLetter{ID: m.ID, Time: streamid.Time(m.ID), Stream: v(event.DeadFieldStream), OriginalID: v(event.DeadFieldID),
		Error: v(event.DeadFieldError), Agent: v(event.DeadFieldAgent), Metadata: map[string]string{}}
	d.Attempts, _ = strconv.Atoi(v(event.DeadFieldAttempts))
	msg := event.DecodeEntry(d.Stream, m.ID, m.Values)
	for k, val := range msg.Metadata {
		if !strings.HasPrefix(k, "_ymir_") {
			d.Metadata[k] = val
		}
	}
	d.Issue, _ = in.canonical(event.EntryIssue(d.Stream, m.ID, m.Values))
	d.EventType, d.CorrelationID = msg.Metadata.Get(event.MetaEventType), msg.Metadata.Get(event.MetaCorrelationID)
	d.UUID, d.Payload = v(event.FieldUUID), v(event.FieldPayload)
	return d
}

// DeadFilter selects dead letters.
type DeadFilter struct {
	Issue  string // "" for every issue
	Before string // a stream id: only entries with a smaller id ("" for all)
}

// NewestDeadLetters returns the newest n dead letters, newest first, and how many the
// stream holds. One round trip (XREVRANGE COUNT n and XLEN), whatever the stream's
// length.
func (in *Inspector) NewestDeadLetters(ctx context.Context, n int64) ([]DeadLetter, int64, error) {
	pipe := in.rdb.Pipeline()
	rng := pipe.XRevRangeN(ctx, in.topo.Dead(), "+", "-", n)
	cnt := pipe.XLen(ctx, in.topo.Dead())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("xrevrange %s: %w", in.topo.Dead(), err)
	}
	out := []DeadLetter{}
	for _, m := range rng.Val() {
		out = append(out, in.deadLetter(m))
	}
	return out, cnt.Val(), nil
}

// TimeID is the smallest stream id of time t ("<unix ms>-0"), for Before bounds.
func TimeID(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) + "-0" }

func fullID(id string) string {
	if !strings.Contains(id, "-") {
		return id + "-0"
	}
	return id
}

// DeadLetters lists the dead-letter stream, oldest first.
//
// Cost: one round trip per PageSize entries of the dead-letter stream (below Before);
// the issue is matched on the client.
func (in *Inspector) DeadLetters(ctx context.Context, f DeadFilter) ([]DeadLetter, error) {
	issue, err := in.issueFilter(f.Issue)
	if err != nil {
		return nil, err
	}
	end := "+"
	if f.Before != "" {
		if err := CheckID(f.Before); err != nil {
			return nil, err
		}
		end = "(" + fullID(f.Before)
	}
	out := []DeadLetter{}
	err = in.scan(ctx, 1, func(int) string { return in.topo.Dead() }, "-", end, func(_ int, m redis.XMessage) {
		d := in.deadLetter(m)
		if issue == "" || d.Issue == issue {
			out = append(out, d)
		}
	})
	return out, err
}

// DeadLetter returns one dead letter, or an error wrapping ErrNotFound. One round trip.
func (in *Inspector) DeadLetter(ctx context.Context, id string) (DeadLetter, error) {
	if err := CheckID(id); err != nil {
		return DeadLetter{}, err
	}
	msgs, err := in.rdb.XRangeN(ctx, in.topo.Dead(), fullID(id), fullID(id), 1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return DeadLetter{}, fmt.Errorf("xrange %s: %w", in.topo.Dead(), err)
	}
	if len(msgs) == 0 {
		return DeadLetter{}, fmt.Errorf("dead letter %s: %w", id, ErrNotFound)
	}
	return in.deadLetter(msgs[0]), nil
}

// Requeued is one dead letter moved back to its stream.
type Requeued struct {
	DeadID    string `json:"dead_id"`
	Stream    string `json:"stream"`
	ID        string `json:"id"` // the new entry in Stream
	Issue     string `json:"issue"`
	EventType string `json:"event_type"`
}

// requeueBatch bounds the entries moved in one transaction.
const requeueBatch = 100

// Requeue moves dead letters back to the streams they were read from: the original
// fields (uuid, payload, metadata) are appended to the stream, without the dead_*
// fields, and the dead letter is deleted. On standalone Redis both happen in one
// MULTI/EXEC under WATCH of the dead-letter stream, so a crash cannot lose or
// duplicate an entry and two operators requeueing the same id move it once. On Redis
// Cluster the streams are in other slots: the append comes first, then the delete
// (a crash between them duplicates, never loses).
//
// It returns the entries moved and, joined, an error for each id that could not be
// (ErrNotFound for an id not in the dead-letter stream, e.g. requeued already).
// Cost: per 100 ids, one round trip to read them and one MULTI/EXEC round trip,
// repeated when another writer touched the dead-letter stream in between.
func (in *Inspector) Requeue(ctx context.Context, ids ...string) (out []Requeued, err error) {
	aerr := in.write(ctx, ActionRequeue, idsScope(ids), in.DeadIssues(ctx, ids), func(ctx context.Context) error {
		out, err = in.requeueIDs(ctx, ids)
		return err
	})
	if out == nil && err == nil {
		return nil, aerr
	}
	return out, err
}

// idsScope is the audit scope of a write on dead letters ids: all of them, however many.
func idsScope(ids []string) string { return IDsScope(ids) }

// IDsScope is the audit scope of a write on the dead letters ids.
func IDsScope(ids []string) string { return "ids=" + strings.Join(ids, ",") }

// DeadIssues returns the issues of the dead letters ids, for the audit record (one round
// trip; ids that are not there or not ids are left out: the write reports them).
func (in *Inspector) DeadIssues(ctx context.Context, ids []string) []string {
	pipe := in.rdb.Pipeline()
	var cmds []*redis.XMessageSliceCmd
	for _, id := range ids {
		if CheckID(id) == nil {
			cmds = append(cmds, pipe.XRangeN(ctx, in.topo.Dead(), fullID(id), fullID(id), 1))
		}
	}
	if len(cmds) == 0 {
		return nil
	}
	_, _ = pipe.Exec(ctx)
	var out []string
	for _, c := range cmds {
		for _, m := range c.Val() {
			if d := in.deadLetter(m); d.Issue != "" && !slices.Contains(out, d.Issue) {
				out = append(out, d.Issue)
			}
		}
	}
	return out
}

func (in *Inspector) requeueIDs(ctx context.Context, ids []string) ([]Requeued, error) {
	var errs []error
	var good []string
	seen := map[string]bool{}
	for _, id := range ids {
		if err := CheckID(id); err != nil {
			errs = append(errs, err)
			continue
		}
		if id = fullID(id); !seen[id] {
			seen[id] = true
			good = append(good, id)
		}
	}
	out := []Requeued{}
	for len(good) > 0 {
		n := min(len(good), requeueBatch)
		done, failed, err := in.requeue(ctx, good[:n])
		out = append(out, done...)
		in.trim(ctx, done)
		errs = append(errs, failed...)
		if err != nil {
			return out, errors.Join(append(errs, err)...)
		}
		good = good[n:]
	}
	return out, errors.Join(errs...)
}

// Errors lists the per-entry errors that Requeue and RequeueAll join into one; nil for
// nil.
func Errors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // splits the join itself
		return j.Unwrap()
	}
	return []error{err}
}

// RequeueAll requeues every dead letter (of issue, when not "").
func (in *Inspector) RequeueAll(ctx context.Context, issue string) (out []Requeued, err error) {
	scope, issues := "all", []string(nil)
	if issue != "" {
		key, kerr := in.canonicalKey(issue)
		if kerr != nil {
			return nil, kerr
		}
		scope, issues = "all of issue="+key, []string{key}
	}
	aerr := in.write(ctx, ActionRequeue, scope, issues, func(ctx context.Context) error {
		dls, err := in.DeadLetters(ctx, DeadFilter{Issue: issue})
		if err != nil {
			return err
		}
		ids := make([]string, len(dls))
		for i, d := range dls {
			ids[i] = d.ID
		}
		out, err = in.requeueIDs(ctx, ids)
		return err
	})
	if out == nil && err == nil {
		return nil, aerr
	}
	return out, err
}

// trim keeps the streams requeued to near MaxLen with event.Trim (best effort), which never
// removes an entry a group still needs; XADD MAXLEN would.
func (in *Inspector) trim(ctx context.Context, done []Requeued) {
	seen := map[string]bool{}
	for _, r := range done {
		if !seen[r.Stream] {
			seen[r.Stream] = true
			_, _ = event.Trim(ctx, in.rdb, r.Stream, in.maxLen)
		}
	}
}

type move struct {
	dl     DeadLetter
	values map[string]any
	issue  string // the index it is filed under (event.IndexIssueOf)
}

// append is the move's append: filed in its issue's index like every other entry, and
// once however often go-redis sends it.
func (mv move) append() xonce.Append {
	return xonce.Append{Stream: mv.dl.Stream, ID: xonce.NewID(), Values: mv.values, TTL: time.Minute, Issue: mv.issue}
}

func (in *Inspector) requeue(ctx context.Context, ids []string) (done []Requeued, failed []error, err error) {
	dead := in.topo.Dead()
	if _, cluster := in.rdb.(*redis.ClusterClient); cluster {
		return in.requeueCluster(ctx, ids)
	}
	backoff := 5 * time.Millisecond
	for range 50 {
		err = in.rdb.Watch(ctx, func(tx *redis.Tx) error {
			done, failed = nil, nil
			moves, f, err := in.readMoves(ctx, tx, ids)
			failed = f
			if err != nil || len(moves) == 0 {
				return err
			}
			adds := make([]*redis.Cmd, len(moves))
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				for i, mv := range moves {
					adds[i] = xonce.Queue(ctx, p, mv.append())
					p.XDel(ctx, dead, mv.dl.ID)
				}
				return nil
			})
			if err != nil {
				return err
			}
			for i, mv := range moves {
				done = append(done, Requeued{DeadID: mv.dl.ID, Stream: mv.dl.Stream, ID: fieldStr(adds[i].Val()),
					Issue: mv.dl.Issue, EventType: mv.dl.EventType})
			}
			return nil
		}, dead)
		if !errors.Is(err, redis.TxFailedErr) {
			return done, failed, err
		}
		// Another writer touched the dead-letter stream: read again.
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
	return nil, nil, fmt.Errorf("requeue: the dead-letter stream kept changing; try again: %w", err)
}

// readMoves reads the dead letters ids (under the caller's WATCH) and checks that each
// can go back where it came from.
func (in *Inspector) readMoves(ctx context.Context, c redis.Cmdable, ids []string) ([]move, []error, error) {
	pipe := c.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.XRangeN(ctx, in.topo.Dead(), id, id, 1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, fmt.Errorf("read dead letters: %w", err)
	}
	var moves []move
	var failed []error
	for i, id := range ids {
		msgs := cmds[i].Val()
		if len(msgs) == 0 {
			failed = append(failed, fmt.Errorf("dead letter %s: %w", id, ErrNotFound))
			continue
		}
		dl := in.deadLetter(msgs[0])
		if _, ok := in.topo.RouteOf(dl.Stream); !ok {
			failed = append(failed, fmt.Errorf("dead letter %s: its stream %q is not an input stream of this pipeline; not requeued", id, dl.Stream))
			continue
		}
		if size, ok := msgs[0].Values[event.DeadFieldSize]; ok {
			failed = append(failed, fmt.Errorf("dead letter %s: %w: it is a truncated copy of an entry of %v bytes; not requeued", id, event.ErrEventTooLarge, size))
			continue
		}
		values := map[string]any{}
		for k, v := range msgs[0].Values {
			if !strings.HasPrefix(k, "dead_") && !strings.HasPrefix(k, "_ymir_") {
				values[k] = v
			}
		}
		if err := event.CheckEvent(values, in.maxBytes); err != nil {
			failed = append(failed, fmt.Errorf("dead letter %s: %w; not requeued", id, err))
			continue
		}
		moves = append(moves, move{dl: dl, values: values,
			issue: event.IndexIssueOf(event.EntryIssue(dl.Stream, "", values), in.locker.Canonicalize)})
	}
	return moves, failed, nil
}

func (in *Inspector) requeueCluster(ctx context.Context, ids []string) ([]Requeued, []error, error) {
	moves, failed, err := in.readMoves(ctx, in.rdb, ids)
	if err != nil {
		return nil, failed, err
	}
	var done []Requeued
	for _, mv := range moves {
		id, err := xonce.Run(ctx, in.rdb, mv.append())
		if err != nil {
			return done, failed, fmt.Errorf("requeue %s to %s: %w", mv.dl.ID, mv.dl.Stream, err)
		}
		if err := in.rdb.XDel(ctx, in.topo.Dead(), mv.dl.ID).Err(); err != nil {
			return done, failed, fmt.Errorf("requeued %s as %s but could not delete it from %s: %w", mv.dl.ID, id, in.topo.Dead(), err)
		}
		done = append(done, Requeued{DeadID: mv.dl.ID, Stream: mv.dl.Stream, ID: id, Issue: mv.dl.Issue, EventType: mv.dl.EventType})
	}
	return done, failed, nil
}

// Purge deletes the dead letters with an id below before ("" for all of them) and
// returns how many went. One round trip (XTRIM MINID, or MAXLEN 0, exact).
func (in *Inspector) Purge(ctx context.Context, before string) (n int64, err error) {
	scope := "all"
	if before != "" {
		if err := CheckID(before); err != nil {
			return 0, err
		}
		scope = "before=" + before
	}
	err = in.write(ctx, ActionPurge, scope, nil, func(ctx context.Context) error {
		if before == "" {
			n, err = in.rdb.XTrimMaxLen(ctx, in.topo.Dead(), 0).Result()
		} else {
			n, err = in.rdb.XTrimMinID(ctx, in.topo.Dead(), fullID(before)).Result()
		}
		return err
	})
	return n, err
}

// Delete deletes the dead letters ids (an operator's purge of selected entries) and
// returns how many existed. One round trip (XDEL).
func (in *Inspector) Delete(ctx context.Context, ids ...string) (n int64, err error) {
	for _, id := range ids {
		if err := CheckID(id); err != nil {
			return 0, err
		}
	}
	err = in.write(ctx, ActionPurge, idsScope(ids), in.DeadIssues(ctx, ids), func(ctx context.Context) error {
		n, err = in.delete(ctx, ids)
		return err
	})
	return n, err
}

func (in *Inspector) delete(ctx context.Context, ids []string) (int64, error) {
	var full []string
	for _, id := range ids {
		if err := CheckID(id); err != nil {
			return 0, err
		}
		full = append(full, fullID(id))
	}
	if len(full) == 0 {
		return 0, nil
	}
	n, err := in.rdb.XDel(ctx, in.topo.Dead(), full...).Result()
	if err != nil {
		return 0, fmt.Errorf("xdel %s: %w", in.topo.Dead(), err)
	}
	return n, nil
}

// stderrMark starts the agent's stderr in a runner's error (runners.Exec).
const stderrMark = "stderr: "

// ErrorBrief is a dead letter's error as a list shows it, on one line (whitespace
// folded) in at most n characters (n at least 10). An error that fits is shown whole;
// of a longer one the list shows its start up to the agent's stderr (what failed:
// "exec runner: exit status 1", at most half of n) and the end, since an agent prints
// why it failed last. An ellipsis stands for the part left out.
func ErrorBrief(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	headN := n / 3
	if i := strings.Index(s, stderrMark); i >= 0 {
		headN = min(utf8.RuneCountInString(s[:i+len(stderrMark)]), n/2)
	}
	tailN := n - headN - 1
	return string(r[:headN]) + "…" + string(r[len(r)-tailN:])
}
