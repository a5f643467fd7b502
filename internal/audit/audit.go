package audit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

//go:embed append.lua
var appendLua string

var appendScript = redis.NewScript(appendLua)

// Record outcomes. A write is recorded as started before it runs; its end is a second
// record (Ref: the first's id) saying done or failed. A refused write has one record.
const (
	OutcomeStarted = "started"
	OutcomeDone    = "done"
	OutcomeFailed  = "failed"
	OutcomeRefused = "refused"
)

// DefaultMaxLen is how many records the trail keeps (approximately) when Config.MaxLen is
// zero: operators write by hand, so this is years of them.
const DefaultMaxLen = 100_000

// Errors a caller tells apart.
var (
	// ErrNoReason: a write was asked for without a reason. Callers name their own flag
	// or field in the message they show.
	ErrNoReason = errors.New("audit: a write needs a reason")
	// ErrNoActor: a write was asked for without an operator identity (Entry.Who).
	ErrNoActor = errors.New("audit: a write needs an operator identity")
	// ErrNotRecorded: the record could not be appended, so the write was not done.
	ErrNotRecorded = errors.New("audit: the action could not be recorded, so it was not done")
)

// Entry is one operator write as recorded.
type Entry struct {
	// Who is the operator: "alice@host" from the CLI, the signed-in operator's name
	// in the console.
	Who string `json:"who"`
	// From is where the write came from: "cli" and the host, or the console and the
	// client's remote address.
	From string `json:"from"`
	// Role is the operator's role in the console ("" from the CLI).
	Role string `json:"role,omitempty"`
	// Action names the command: release, replay, requeue, purge, budget approve.
	Action string `json:"action"`
	// Scope is the action's exact scope, as the operator gave it ("agent=triage
	// issue=RHEL-7", "ids=1-0,2-0", "stream=ymir:triage from=- to=+").
	Scope string `json:"scope"`
	// Issues are the canonical issue keys the action touches (the record is filed
	// under each; none for an action on no single issue).
	Issues []string `json:"issues,omitempty"`
	// Reason is why, in the operator's words. Required by Do.
	Reason string `json:"reason"`
}

// Record is one record of the trail.
type Record struct {
	Entry
	ID      string    `json:"id"`
	Time    time.Time `json:"time"`
	Outcome string    `json:"outcome"`
	// Detail: why a write failed or was refused, or what it did.
	Detail string `json:"detail,omitempty"`
	// Ref is the started record a done or failed one ends.
	Ref string `json:"ref,omitempty"`
}

// Config configures a Log.
type Config struct {
	// Client is the Redis client; Stream the audit stream (event.Topology.Audit).
	Client redis.UniversalClient
	Stream string
	// MaxLen bounds the stream (approximately). Default DefaultMaxLen.
	MaxLen int64
}

// Log appends to and reads the audit trail.
type Log struct {
	rdb    redis.UniversalClient
	stream string
	maxLen int64
}

// New returns a Log. It does no I/O.
func New(cfg Config) (*Log, error) {
	if cfg.Client == nil || cfg.Stream == "" {
		return nil, errors.New("audit: Config needs a Client and a Stream")
	}
	if cfg.MaxLen <= 0 {
		cfg.MaxLen = DefaultMaxLen
	}
	return &Log{rdb: cfg.Client, stream: cfg.Stream, maxLen: cfg.MaxLen}, nil
}

// Stream is the audit stream's key.
func (l *Log) Stream() string { return l.stream }

// Check says what is missing from e for a write: ErrNoActor or ErrNoReason.
func Check(e Entry) error {
	switch {
	case strings.TrimSpace(e.Who) == "":
		return ErrNoActor
	case strings.TrimSpace(e.Reason) == "":
		return ErrNoReason
	case e.Action == "":
		return errors.New("audit: Entry.Action is empty")
	}
	return nil
}

// Do is the one path of an operator's write: it records e (outcome started), then runs
// fn, then records how fn ended. When e lacks an identity or a reason, or the record
// cannot be appended, fn does not run and Do returns ErrNoActor, ErrNoReason or
// ErrNotRecorded (wrapping Redis's error). The end record is best effort: fn has acted by
// then, and the started record already says who asked for what.
func (l *Log) Do(ctx context.Context, e Entry, fn func(context.Context) error) error {
	if err := Check(e); err != nil {
		return err
	}
	id, err := l.append(ctx, e, map[string]any{"outcome": OutcomeStarted})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	ferr := fn(ctx)
	end := map[string]any{"outcome": OutcomeDone, "ref": id}
	if ferr != nil {
		end["outcome"], end["detail"] = OutcomeFailed, clip(ferr.Error())
	}
	// The end is recorded even when ctx ended with fn (a timeout): fn may have acted.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = l.append(ectx, e, end)
	return ferr
}

// Refused records a write that was refused before it ran (a viewer's write, a missing
// reason), with why. Its error is Redis's.
func (l *Log) Refused(ctx context.Context, e Entry, why string) error {
	_, err := l.append(ctx, e, map[string]any{"outcome": OutcomeRefused, "detail": clip(why)})
	return err
}

// maxText bounds a field written from an operator's or Redis's words.
const maxText = 2000

func clip(s string) string {
	if r := []rune(s); len(r) > maxText {
		return string(r[:maxText-1]) + "…"
	}
	return s
}

func (l *Log) append(ctx context.Context, e Entry, extra map[string]any) (string, error) {
	v := map[string]any{"who": clip(e.Who), "from": clip(e.From), "role": e.Role, "action": e.Action,
		"scope": clip(e.Scope), "issues": strings.Join(e.Issues, ","), "reason": clip(e.Reason),
		"at": time.Now().UTC().Format(time.RFC3339Nano)}
	for k, x := range extra {
		v[k] = x
	}
	keys := []string{l.stream, xonce.IndexSinceKey(l.stream)}
	issues := slices.Clone(e.Issues)
	slices.Sort(issues)
	for _, is := range slices.Compact(issues) {
		if is != "" {
			keys = append(keys, xonce.IndexKey(l.stream, is))
		}
	}
	args := []any{l.maxLen, xonce.IndexMax, xonce.IndexTTL.Milliseconds()}
	fields := make([]string, 0, len(v))
	for k := range v {
		fields = append(fields, k)
	}
	slices.Sort(fields)
	for _, k := range fields {
		args = append(args, k, v[k])
	}
	id, err := appendScript.Run(ctx, l.rdb, keys, args...).Text()
	if err != nil {
		return "", fmt.Errorf("append to %s: %w", l.stream, err)
	}
	return id, nil
}
