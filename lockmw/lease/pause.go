package lease

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Pause (issue 38): an operator stops new runs in a scope (an agent, an agent on a
// branch, an issue, or the events whose field has a value) until a resume. A worker
// checks the pauses after it took an event's lease (Pauses.Check); an event of a
// paused scope gives its lease back and is parked in the pause's line, acked in the
// same script that parks it (scripts/park.lua); a resume appends the line's events
// to their streams again in stream order, each once, and ends the pause when the line
// is empty (scripts/resume.lua). See docs/operations.md#pause-and-resume.
//
// The guarantee, with the check after the acquire: a run starts only if its check,
// after its lease was written, did not see the pause. So a pause's writer that lists
// the live leases of its scope after writing the pause sees every run that may still
// start or run in it (Pauses.Set's caller: --stop-running releases them); every other
// event of the scope parks. "No run starts once the pause is visible", with the runs
// already past their check named.
//
// A lease taken ahead in a batch (HandoffBatch, Next.Pauses) may have its check made
// in the batch's own script, after its acquire and atomic with it: when no pause
// exists and its entry was never parked, it runs without a check of its own
// (Pending.PauseChecked). That is the same order (lease, then check), so the same
// guarantee: a pause written after the batch finds the lease held, and listed.

var (
	//go:embed scripts/pause.lua
	pauseLua string
	//go:embed scripts/park.lua
	parkLua string
	//go:embed scripts/resume.lua
	resumeLua string

	parkScript   = newScript(pauseLua, parkLua)
	resumeScript = newScript(pauseLua, resumeLua)
)

// MetaParkedFrom names, on the copy of a parked event that a resume appended to its
// stream again, the stream entry the event first had (its lid): every copy of one
// event is one member of a pause's line, in the order of its first entry.
const MetaParkedFrom = "parked_from"

// The values of Pause.State.
const (
	pauseStatePaused   = "paused"
	pauseStateResuming = "resuming"
)

// ErrBadPauseScope is wrapped by ParsePauseScope's errors.
var ErrBadPauseScope = errors.New("lease: bad pause scope")

// PauseScope is what a pause stops: exactly one of an agent (and optionally its
// branch), an issue, or a field's value.
type PauseScope struct {
	Agent, Branch string // agent:<agent> or agent:<agent>/<branch>
	Issue         string // issue:<KEY>, canonical
	// Field is a dotted path into the event's JSON payload (metadata.component) or
	// m:<name>, a metadata value; Value its value (compared trimmed, case folded).
	Field, Value string
}

// String is the scope's canonical name: agent:rebase/c9s, issue:RHEL-1,
// field:metadata.component=kernel.
func (p PauseScope) String() string {
	switch {
	case p.Agent != "" && p.Branch != "":
		return "agent:" + p.Agent + "/" + p.Branch
	case p.Agent != "":
		return "agent:" + p.Agent
	case p.Issue != "":
		return "issue:" + p.Issue
	}
	return "field:" + p.Field + "=" + p.Value
}

// ParsePauseScope parses agent:<agent>[/<branch>], issue:<KEY> or
// field:<path>=<value> (path as in a group scope: metadata.component, m:<name>). The
// agent and branch are checked by the caller (this package does not know them).
func (l *Locker) ParsePauseScope(s string) (PauseScope, error) {
	kind, rest, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || rest == "" {
		return PauseScope{}, fmt.Errorf("%w: %q: want agent:<agent>[/<branch>], issue:<KEY> or field:<path>=<value>", ErrBadPauseScope, s)
	}
	switch kind {
	case "agent":
		agent, branch, _ := strings.Cut(rest, "/")
		if !pauseWord(agent) || (branch != "" && !pauseWord(branch)) {
			return PauseScope{}, fmt.Errorf("%w: %q: agent and branch are lower-case words", ErrBadPauseScope, s)
		}
		return PauseScope{Agent: agent, Branch: branch}, nil
	case "issue":
		issue, err := l.Canonicalize(rest)
		if err != nil {
			return PauseScope{}, fmt.Errorf("%w: %q: %w", ErrBadPauseScope, s, err)
		}
		return PauseScope{Issue: issue}, nil
	case "field":
		path, value, ok := strings.Cut(rest, "=")
		value = strings.TrimSpace(value)
		if !ok || value == "" || len(value) > maxKeyLen || strings.ContainsAny(value, " \t\n") {
			return PauseScope{}, fmt.Errorf("%w: %q: want field:<path>=<value>, a value without spaces", ErrBadPauseScope, s)
		}
		if err := checkPath(path); err != nil {
			return PauseScope{}, fmt.Errorf("%w: %q: %w", ErrBadPauseScope, s, err)
		}
		return PauseScope{Field: path, Value: value}, nil
	}
	return PauseScope{}, fmt.Errorf("%w: %q: the kind is agent, issue or field", ErrBadPauseScope, s)
}

func pauseWord(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// PauseTarget is an event as a pause matches it.
type PauseTarget struct {
	Agent, Branch, Issue string
	Payload              []byte
	Meta                 func(string) string // metadata, for m: fields; may be nil
}

// Matches reports whether the event t is in the scope.
func (p PauseScope) Matches(t PauseTarget) bool {
	switch {
	case p.Agent != "":
		return p.Agent == t.Agent && (p.Branch == "" || p.Branch == t.Branch)
	case p.Issue != "":
		return p.Issue == t.Issue
	case p.Field == "":
		return false
	}
	var raw string
	if m, ok := strings.CutPrefix(p.Field, "m:"); ok {
		if t.Meta != nil {
			raw = t.Meta(m)
		}
	} else {
		var doc any
		if json.Unmarshal(t.Payload, &doc) != nil {
			return false
		}
		raw, _ = lookupPath(doc, p.Field)
	}
	return raw != "" && strings.EqualFold(strings.TrimSpace(raw), p.Value)
}

// Pause is one active pause, as recorded, and (from List) what waits in its line.
type Pause struct {
	Scope       string    `json:"scope"`
	Reason      string    `json:"reason"`
	By          string    `json:"by"`
	At          time.Time `json:"at"`
	StopRunning bool      `json:"stop_running"`
	// State is "paused", or "resuming" while a resume republishes its line.
	State string `json:"state"`
	// Waiting is how many events are parked in its line, OldestAt when the head of the
	// line first entered its stream (List only).
	Waiting  int64     `json:"waiting"`
	OldestAt time.Time `json:"oldest_at,omitzero"`
}

// Parked is one event in a pause's line.
type Parked struct {
	LineID   string    `json:"line_id"`
	Stream   string    `json:"stream"`
	ParkedAt time.Time `json:"parked_at"`
}

// PauseKeys are the Redis keys of the pauses of a lease scope, in one hash slot.
type PauseKeys struct {
	Reg  string // hash: scope name -> the Pause as JSON
	Seen string // hash: "<stream> <entry id>" -> w: that entry was parked
	tag  string
}

// line is the key of the line of the pause named name.
func (k PauseKeys) line(name string) string { return "lockpauseline:" + k.tag + ":" + name }

// pauseSeenTTL is how long the record of parked and republished entries lives after
// its last write: long after any redelivery of a parked entry.
const pauseSeenTTL = 7 * 24 * time.Hour

// Pauses reads and writes the pauses of a Locker's scope. It is cheap: make one where
// needed.
type Pauses struct {
	l    *Locker
	keys PauseKeys
	// afterPublish, in tests, runs after each republish of Resume (the model's crash
	// between a publish and the step that takes it out of the line).
	afterPublish func(n int) error
}

// Pauses returns the pauses of the Locker's scope (Options.Scope).
func (l *Locker) Pauses() *Pauses {
	tag := l.opts.Scope + "pause"
	if l.opts.Format == KeysCluster {
		tag = "{" + tag + "}"
	}
	return &Pauses{l: l, keys: PauseKeys{Reg: "lockpause:" + tag, Seen: "lockpauseseen:" + tag, tag: tag}}
}

// Keys returns the keys of the pauses.
func (p *Pauses) Keys() PauseKeys { return p.keys }

// Set pauses a scope (or records a pause again: its line stays, a resume under way
// stops at its next step). It reports whether the scope was not paused before.
func (p *Pauses) Set(ctx context.Context, pa Pause) (bool, error) {
	if pa.Scope == "" {
		return false, errors.New("lease: Pause.Scope is empty")
	}
	pa.State, pa.Waiting, pa.OldestAt = pauseStatePaused, 0, time.Time{}
	if pa.At.IsZero() {
		pa.At = time.Now()
	}
	b, err := json.Marshal(pa)
	if err != nil {
		return false, err
	}
	pipe := p.l.rdb.Pipeline()
	cmd := pipe.HSet(ctx, p.keys.Reg, pa.Scope, b)
	_, _ = pipe.Exec(ctx)
	n, err := cmd.Result()
	if err != nil {
		return false, fmt.Errorf("lease: pause %s: %w", pa.Scope, err)
	}
	return n == 1, nil
}

// List returns the active pauses, sorted by scope, each with its line's length. Two
// round trips.
func (p *Pauses) List(ctx context.Context) ([]Pause, error) {
	pipe := p.l.rdb.Pipeline()
	cmd := pipe.HGetAll(ctx, p.keys.Reg)
	_, _ = pipe.Exec(ctx)
	all, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("lease: list pauses: %w", err)
	}
	out := decodePauses(all)
	if len(out) == 0 {
		return out, nil
	}
	pipe = p.l.rdb.Pipeline()
	n := make([]*redis.IntCmd, len(out))
	heads := make([]*redis.ZSliceCmd, len(out))
	for i, pa := range out {
		n[i] = pipe.ZCard(ctx, p.keys.line(pa.Scope))
		heads[i] = pipe.ZRangeWithScores(ctx, p.keys.line(pa.Scope), 0, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("lease: count parked events: %w", err)
	}
	for i := range out {
		out[i].Waiting = n[i].Val()
		if h := heads[i].Val(); len(h) > 0 {
			out[i].OldestAt = time.UnixMilli(int64(h[0].Score))
		}
	}
	return out, nil
}

func decodePauses(all map[string]string) []Pause {
	out := make([]Pause, 0, len(all))
	for name, v := range all {
		var pa Pause
		if json.Unmarshal([]byte(v), &pa) != nil || pa.State == "" {
			pa.State = pauseStatePaused
		}
		pa.Scope = name
		out = append(out, pa)
	}
	slices.SortFunc(out, func(a, b Pause) int { return strings.Compare(a.Scope, b.Scope) })
	return out
}

// Parked lists the events parked in the pause named scope, the head first.
func (p *Pauses) Parked(ctx context.Context, scope string) ([]Parked, error) {
	pipe := p.l.rdb.Pipeline()
	cmd := pipe.ZRange(ctx, p.keys.line(scope), 0, -1)
	_, _ = pipe.Exec(ctx)
	raw, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("lease: read %s: %w", p.keys.line(scope), err)
	}
	out := make([]Parked, 0, len(raw))
	for _, r := range raw {
		w, err := parseWaiting(r)
		if err != nil {
			return nil, err
		}
		out = append(out, Parked{LineID: w.LineID, Stream: w.Stream, ParkedAt: w.JoinedAt})
	}
	return out, nil
}

// Verdict is what Check decided for an event.
type Verdict int

const (
	// Run says no pause holds the event; it runs.
	Run Verdict = iota
	// ParkedNow says the event was put in a pause's line (and acked, on standalone Redis):
	// its lease is to be given back, and it is not run.
	ParkedNow
	// Repeat says the entry was parked already (a redelivery): it is
	// acked and not run.
	Repeat
)

// ParkEntry is the event Check may park: its stream entry, its line id, and its
// copy's fields (made only when it parks).
type ParkEntry struct {
	Stream, Group, ID string
	// LineID is the entry the event first had (its MetaParkedFrom, else ID); Copy says
	// it is a copy a resume published (it has MetaParkedFrom).
	LineID string
	Copy   bool
	// Fields returns the stream fields of its copy, which must carry MetaParkedFrom
	// = LineID.
	Fields func() (map[string]any, error)
	// Issue is the event's canonical issue key: its copy is filed in the issue's index.
	Issue string
	// Ack: on standalone Redis, park.lua acks the entry itself (Acked in the
	// reply). Default false: the caller acks.
	Ack bool
}

// CheckResult is Check's answer.
type CheckResult struct {
	Verdict  Verdict
	Scope    string // the pause that parked it
	Position int64  // its place in the line (1: the head)
	Acked    bool   // park.lua acked the entry (standalone Redis, ParkEntry.Ack)
}

// Check decides whether the event t (entry e) may run now, after its lease was
// taken: one round trip when no pause holds it (the registry and the entry's record,
// read together), two when one does (the park). See the package's pause comment for
// the guarantee.
func (p *Pauses) Check(ctx context.Context, t PauseTarget, e ParkEntry) (CheckResult, error) {
	pkey := e.Stream + " " + e.ID
	pipe := p.l.rdb.Pipeline()
	reg := pipe.HGetAll(ctx, p.keys.Reg)
	seen := pipe.HGet(ctx, p.keys.Seen, pkey)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return CheckResult{}, fmt.Errorf("lease: check pauses: %w", err)
	}
	if seen.Val() == "w" {
		return CheckResult{Verdict: Repeat}, nil
	}
	for _, pa := range decodePauses(reg.Val()) {
		if pa.State == pauseStateResuming && e.Copy {
			continue // a copy the resume appended: it runs, in its stream's order
		}
		sc, err := p.l.ParsePauseScope(pa.Scope)
		if err != nil || !sc.Matches(t) {
			continue
		}
		res, err := p.park(ctx, pa.Scope, e)
		if err != nil || res.Verdict != Run {
			return res, err
		}
	}
	return CheckResult{Verdict: Run}, nil
}

// park runs park.lua for the pause scope.
func (p *Pauses) park(ctx context.Context, scope string, e ParkEntry) (CheckResult, error) {
	fields, err := e.Fields()
	if err != nil {
		return CheckResult{}, err
	}
	keys := []string{p.keys.Reg, p.keys.Seen, p.keys.line(scope)}
	ack := e.Ack && p.l.opts.Format != KeysCluster
	group, id := "", e.ID
	if ack {
		keys = append(keys, e.Stream)
		group = e.Group
	}
	copyFlag := "0"
	if e.Copy {
		copyFlag = "1"
	}
	args := []any{scope, e.LineID, copyFlag, e.Stream, group, id, pauseSeenTTL.Milliseconds(), pauseIssueField, e.Issue}
	for _, k := range slices.Sorted(mapKeys(fields)) {
		args = append(args, k, fields[k])
	}
	res, err := parkScript.Run(ctx, p.l.rdb, keys, args...).Int64Slice()
	if err != nil || len(res) < 2 {
		return CheckResult{}, fmt.Errorf("lease: park in %s: %v %w", scope, res, err)
	}
	switch res[0] {
	case 1:
		return CheckResult{Verdict: ParkedNow, Scope: scope, Position: res[1], Acked: ack}, nil
	case 2:
		return CheckResult{Verdict: Repeat, Acked: ack}, nil
	}
	return CheckResult{Verdict: Run}, nil
}

func mapKeys(m map[string]any) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Resumed is what Resume did.
type Resumed struct {
	Scope     string `json:"scope"`
	Published int    `json:"published"` // events appended to their streams again
	// Found: the scope was paused (false: nothing was done). Again: it was paused
	// again while the resume ran; the pause stays, with what is left of its line.
	Found, Again bool
}

// Resume republishes the line of the pause named scope to its events' streams, in
// stream order, each once (a crash anywhere repeats nothing and loses nothing: run
// Resume again), then ends the pause. Events of the scope that arrive meanwhile park
// behind the line and are republished too. Two round trips per parked event.
func (p *Pauses) Resume(ctx context.Context, scope string, maxLen int64) (Resumed, error) {
	r := Resumed{Scope: scope}
	keys := []string{p.keys.Reg, p.keys.Seen, p.keys.line(scope)}
	published, begin := "", "1"
	for {
		res, err := resumeScript.Run(ctx, p.l.rdb, keys, scope, published, pauseSeenTTL.Milliseconds(), begin).Slice()
		if err != nil || len(res) < 1 {
			return r, fmt.Errorf("lease: resume %s: %v %w", scope, res, err)
		}
		begin = "0"
		switch atoi(res[0]) {
		case 0:
			return r, nil
		case 1:
			r.Found = true
			return r, nil
		case 3:
			r.Found, r.Again = true, true
			return r, nil
		}
		r.Found = true
		if published, err = p.publish(ctx, scope, maxLen, res[1:]); err != nil {
			return r, err
		}
		r.Published++
		if p.afterPublish != nil {
			if err := p.afterPublish(r.Published); err != nil {
				return r, err
			}
		}
	}
}

// publish appends a line's head ({published id, stream, field, value, ...}) to its
// stream, once per parking, and returns its published id.
func (p *Pauses) publish(ctx context.Context, scope string, maxLen int64, h []any) (string, error) {
	if len(h) < 2 {
		return "", fmt.Errorf("lease: pause line head reply %v", h)
	}
	pub, stream := fmt.Sprint(h[0]), fmt.Sprint(h[1])
	values := map[string]any{}
	issue := ""
	for i := 2; i+1 < len(h); i += 2 {
		if k := fmt.Sprint(h[i]); k == pauseIssueField {
			issue = fmt.Sprint(h[i+1])
		} else {
			values[k] = h[i+1]
		}
	}
	if _, err := xonce.Run(ctx, p.l.rdb, xonce.Append{Stream: stream, ID: "pause-" + scope + "-" + pub,
		Issue: issue, Values: values, MaxLen: maxLen, TTL: pauseSeenTTL}); err != nil {
		return "", fmt.Errorf("lease: republish %s from the line of %s: %w", pub, scope, err)
	}
	return pub, nil
}

// pauseIssueField is the member field of a parked event that names its issue (for
// the per-issue index of its copy); it is not one of the copy's stream fields.
const pauseIssueField = "_issue"

// Park gives back a lease whose event a pause parked (Pauses.Check): no run happened
// under it. A wait lease's turn ends as a failed run's does (the event has left the
// key's line for the pause's; the key goes to the line's next head, which parks too
// while the pause lasts); its copy joins the key's line again when a resume
// republishes it and the key is busy.
func (le *Lease) Park(ctx context.Context) error {
	if le.line != nil {
		_, err := le.endLine(ctx, nil, outcomeGivenBack, turnPass, nil)
		return err
	}
	return le.GiveBack(ctx)
}
