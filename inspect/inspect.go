package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// The actions of the Inspector's writes, as the audit trail names them.
const (
	ActionRelease = "release"
	ActionReplay  = "replay"
	ActionRequeue = "requeue"
	ActionPurge   = "purge"
)

// DefaultPageSize is the COUNT of each XPENDING and XRANGE page the Inspector reads.
const DefaultPageSize = 1000

// Config configures an Inspector.
type Config struct {
	// Client is the Redis client; the Inspector never closes it.
	Client redis.UniversalClient
	// Topology names the streams and groups.
	Topology event.Topology
	// Locker finds leases; it must use the workers' Scope and Format.
	Locker *lease.Locker
	// MaxLen: Replay and Requeue keep the streams they append to near MaxLen with
	// event.Trim, which spares entries a group still needs (0: never trim).
	MaxLen int64
	// MaxEventBytes bounds what Replay and Requeue publish (0: DefaultMaxEventBytes).
	MaxEventBytes int
	// PageSize is the COUNT of each XPENDING and XRANGE call (default 1000).
	PageSize int64
	// Now is the clock for ages (default time.Now).
	Now func() time.Time
	// Audit records every write (ForceRelease, Replay, Requeue, RequeueAll, Purge,
	// Delete) before it runs, with the operator of its context (audit.WithOperator).
	// Default: the trail on Client at Topology.Audit().
	Audit *audit.Log
}

// Inspector answers an operator's questions about one pipeline: pending entries and
// the leases guarding them, live leases, streams and groups, the history of an issue,
// replays and dead letters. Every call reads in pages and pipelines its lookups; the
// round trips of each are stated on the method.
type Inspector struct {
	rdb      redis.UniversalClient
	topo     event.Topology
	locker   *lease.Locker
	maxLen   int64
	maxBytes int
	page     int64
	now      func() time.Time
	srv      serverCache
	audit    *audit.Log
}

// New returns an Inspector. It does no I/O.
func New(cfg Config) (*Inspector, error) {
	if cfg.Client == nil || cfg.Locker == nil {
		return nil, errors.New("inspect: Config needs a Client and a Locker")
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Audit == nil {
		var err error
		if cfg.Audit, err = audit.New(audit.Config{Client: cfg.Client, Stream: cfg.Topology.Audit()}); err != nil {
			return nil, err
		}
	}
	return &Inspector{rdb: cfg.Client, topo: cfg.Topology, locker: cfg.Locker, maxLen: cfg.MaxLen,
		maxBytes: cfg.MaxEventBytes, page: cfg.PageSize, now: cfg.Now, audit: cfg.Audit}, nil
}

// write is the one path of the Inspector's writes: fn runs only once the audit trail
// has recorded the operator of ctx asking for action on scope (audit.Log.Do).
func (in *Inspector) write(ctx context.Context, action, scope string, issues []string, fn func(context.Context) error) error {
	return in.audit.Do(ctx, audit.OperatorFrom(ctx).Entry(action, scope, issues...), fn)
}

// AuditLog is the trail the Inspector records its writes in: for a refusal
// (audit.Log.Refused) and for the writes of other packages (budget approve).
func (in *Inspector) AuditLog() *audit.Log { return in.audit }

// Audit lists the trail (audit.Log.List).
func (in *Inspector) Audit(ctx context.Context, f audit.Filter) ([]audit.Record, error) {
	if f.Issue != "" {
		k, err := in.canonicalKey(f.Issue)
		if err != nil {
			return nil, err
		}
		f.Issue = k
	}
	return in.audit.List(ctx, f)
}

// issueFilter canonicalises an optional issue filter ("" for none).
func (in *Inspector) issueFilter(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	return in.canonicalKey(raw)
}

// KeyForm says what an issue key looks like, for messages about one that is not.
const KeyForm = "an issue key is a project key, a dash and a number, e.g. RHEL-123"

// BadKeyError is an issue key an operator gave that is not one. It wraps the lease's
// error (lease.ErrInvalidKey); its message is BadKey's, the same in the CLI and the
// console.
type BadKeyError struct {
	Key string
	Err error
}

func (e *BadKeyError) Error() string { return BadKey(e.Key) }
func (e *BadKeyError) Unwrap() error { return e.Err }

// BadKey says that key is not an issue key, in a plain sentence with an example rather
// than the lease's pattern; a long key is quoted clipped.
func BadKey(key string) string {
	switch {
	case strings.TrimSpace(key) == "":
		return "the issue key is empty: " + KeyForm
	case utf8.RuneCountInString(key) > 64:
		return fmt.Sprintf("%q… (%d characters) is not an issue key: %s", string([]rune(key)[:40]), len(key), KeyForm)
	}
	return fmt.Sprintf("%q is not an issue key: %s", key, KeyForm)
}

// CanonicalKey is the lease's canonical form of raw ("rhel-1 " is "RHEL-1"), or a
// *BadKeyError.
func (in *Inspector) CanonicalKey(raw string) (string, error) { return in.canonicalKey(raw) }

// canonicalKey is the lease's canonical form of raw, or a *BadKeyError.
func (in *Inspector) canonicalKey(raw string) (string, error) {
	k, err := in.locker.Canonicalize(raw)
	if err != nil {
		return "", &BadKeyError{Key: raw, Err: err}
	}
	return k, nil
}

// ErrNotFound is returned for a stream entry or lease that does not exist.
var ErrNotFound = errors.New("not found")

// ErrBadID is returned for a string that is not a stream id.
var ErrBadID = errors.New("not a stream id")

// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var streamIDPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9]{1,20}(-[0-9]{1,20})?$`) })

// CheckID checks a stream id as XRANGE takes it: "ms" or "ms-seq".
func CheckID(id string) error {
	if !streamIDPattern().MatchString(id) {
		return fmt.Errorf("%w: %q (want MS or MS-SEQ, e.g. 1700000000000-0)", ErrBadID, id)
	}
	return nil
}

// CheckRangeID checks a range bound: a stream id, "-", "+", or "(" before an id
// (exclusive).
func CheckRangeID(id string) error {
	if id == "-" || id == "+" {
		return nil
	}
	return CheckID(strings.TrimPrefix(id, "("))
}

// ResolveStream names an input stream of the topology, given in full ("ymir:triage")
// or relative to the namespace ("triage", "rebase:c9s:todo").
func ResolveStream(t event.Topology, name string) (event.Route, error) {
	if r, ok := t.RouteOf(name); ok {
		return r, nil
	}
	if r, ok := t.RouteOf(strings.TrimSuffix(t.Dead(), ":dead") + ":" + name); ok {
		return r, nil
	}
	var names []string
	for _, r := range t.AllInputs() {
		names = append(names, r.Stream)
	}
	return event.Route{}, fmt.Errorf("%q is not an input stream of this pipeline (one of %s)", name, strings.Join(names, ", "))
}

// LeaseInfo is the operator's view of a live lease.
type LeaseInfo struct {
	Agent string `json:"agent"`
	Issue string `json:"issue"`
	// Owner is the holder (a consumer name); empty for a plain lock key without a
	// record, e.g. a Python agent's.
	Owner      string        `json:"owner"`
	Fence      int64         `json:"fence"`
	AcquiredAt time.Time     `json:"acquired_at,omitzero"`
	Held       time.Duration `json:"-"` // since AcquiredAt
	TTL        time.Duration `json:"-"` // time left; 0 when unknown
	// MessageID is the stream entry the lease guards; Stream its stream, when the
	// lease's record names it (an agent's stream and its :todo twin repeat entry ids).
	MessageID string `json:"message_id"`
	Stream    string `json:"stream,omitempty"`
	// Scope is what the key guards: agent (Agent's own lease on Issue), issue or group
	// (a shared key, held by Agent's run on Issue); Key is the key it guards (the
	// issue, or the group key).
	Scope string `json:"scope"`
	Key   string `json:"key"`
	// Mailbox is the number of follow-ups waiting in the lease's mailbox
	// (ON_CONFLICT=deliver).
	Mailbox int64 `json:"mailbox"`
	// Supersedes is the entry whose run this lease took over (ON_CONFLICT=supersede).
	Supersedes string `json:"supersedes,omitempty"`
	// Waiting is the number of events in the key's line (ON_CONFLICT=wait), the oldest
	// waiting since OldestWaiting; Reserved: the key is handed to the line's head,
	// whose copy has not started yet.
	Waiting       int64     `json:"waiting"`
	OldestWaiting time.Time `json:"oldest_waiting,omitzero"`
	Reserved      bool      `json:"reserved,omitempty"`
}

// Line is the lease's line in words: "3 waiting, oldest 40s", or "" when none waits.
func (l LeaseInfo) Line(now time.Time) string {
	if l.Waiting == 0 {
		return ""
	}
	s := fmt.Sprintf("%d waiting", l.Waiting)
	if !l.OldestWaiting.IsZero() {
		s += ", oldest " + max(now.Sub(l.OldestWaiting), 0).Round(time.Second).String()
	}
	return s
}

// MarshalJSON adds held_ms and ttl_ms.
func (l LeaseInfo) MarshalJSON() ([]byte, error) {
	type plain LeaseInfo
	return json.Marshal(struct {
		plain
		HeldMS int64 `json:"held_ms"`
		TTLMS  int64 `json:"ttl_ms"`
	}{plain(l), l.Held.Milliseconds(), l.TTL.Milliseconds()})
}

func (in *Inspector) leaseInfo(i lease.Info) LeaseInfo {
	li := LeaseInfo{Agent: i.Agent, Issue: i.Issue, Owner: i.Owner, Fence: i.Fence, AcquiredAt: i.AcquiredAt,
		TTL: i.TTL, MessageID: i.MessageID, Stream: i.Stream, Scope: string(i.Scope), Key: i.Key,
		Mailbox: i.Mailbox, Supersedes: i.Supersedes, Waiting: i.Waiting, OldestWaiting: i.OldestWaiting, Reserved: i.Reserved}
	if li.Scope == "" {
		li.Scope, li.Key = string(lease.ScopeAgent), i.Issue
	}
	if !i.AcquiredAt.IsZero() {
		li.Held = max(in.now().Sub(i.AcquiredAt), 0)
	}
	return li
}

// LockFilter selects leases. Issue set: direct lookups of that issue's lease of each
// agent (no SCAN).
type LockFilter struct {
	Agent string // "" for every agent
	Issue string
}

// Locks returns the live leases of the pipeline, ordered by agent and issue.
//
// Cost: with Issue, one round trip (two commands per agent). Without, a SCAN MATCH
// of the lease-record pattern, which visits every key of the database in steps of
// 1000 keys (one round trip each), then one round trip per 500 leases found.
func (in *Inspector) Locks(ctx context.Context, f LockFilter) ([]LeaseInfo, error) {
	agents := event.Agents
	if f.Agent != "" {
		if !slices.Contains(event.Agents, f.Agent) {
			return nil, fmt.Errorf("unknown agent %q (want one of %v)", f.Agent, event.Agents)
		}
		agents = []string{f.Agent}
	}
	var infos []lease.Info
	if f.Issue != "" {
		issue, err := in.canonicalKey(f.Issue)
		if err != nil {
			return nil, err
		}
		refs := make([]lease.Ref, len(agents))
		for i, a := range agents {
			refs[i] = lease.Ref{Agent: a, Issue: issue}
		}
		live, err := in.locker.InspectMany(ctx, refs)
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			if i, ok := live[r]; ok {
				infos = append(infos, i)
			}
		}
		// The issue's shared key (LOCK_SCOPE issue), held by a run of one of agents.
		if i, ok, err := in.locker.InspectShared(ctx, lease.ScopeKey{Scope: lease.ScopeIssue, Key: issue}); err != nil {
			return nil, err
		} else if ok && slices.Contains(agents, i.Agent) {
			infos = append(infos, i)
		}
	} else {
		all, err := in.locker.List(ctx, f.Agent)
		if err != nil {
			return nil, err
		}
		for _, i := range all {
			if slices.Contains(agents, i.Agent) {
				infos = append(infos, i)
			}
		}
	}
	out := make([]LeaseInfo, len(infos))
	for i, info := range infos {
		out[i] = in.leaseInfo(info)
	}
	return out, nil
}

// Released is the outcome of ForceRelease.
type Released struct {
	Agent string `json:"agent"`
	Issue string `json:"issue"`
	// Holder is the lease that was force-released (nil: nobody held it and nothing
	// was done).
	Holder *LeaseInfo `json:"holder"`
	// Fence is the fence after the release: the evicted holder's fenced writes are
	// refused from now on, and the next holder gets a higher one.
	Fence int64 `json:"fence,omitempty"`
}

// Lease returns the live lease (agent, issue), or ErrNotFound. One round trip.
func (in *Inspector) Lease(ctx context.Context, agent, issue string) (LeaseInfo, error) {
	if !slices.Contains(event.Agents, agent) {
		return LeaseInfo{}, fmt.Errorf("unknown agent %q (want one of %v)", agent, event.Agents)
	}
	info, ok, err := in.locker.Inspect(ctx, agent, issue)
	if errors.Is(err, lease.ErrInvalidKey) {
		return LeaseInfo{}, &BadKeyError{Key: issue, Err: err}
	}
	if err != nil {
		return LeaseInfo{}, err
	}
	if !ok {
		return LeaseInfo{}, fmt.Errorf("lease %s %s: %w", agent, issue, ErrNotFound)
	}
	return in.leaseInfo(info), nil
}

// ForceRelease deletes the lease (agent, issue) whoever holds it and bumps its fence
// so the old holder is fenced out (its next fenced publish is refused and its next
// heartbeat cancels its work). An issue nobody holds is left alone. Two round trips.
func (in *Inspector) ForceRelease(ctx context.Context, agent, issue string) (rel Released, err error) {
	key, err := in.canonicalKey(issue)
	if err != nil {
		return Released{}, err
	}
	err = in.write(ctx, ActionRelease, "agent="+agent+" issue="+key, []string{key}, func(ctx context.Context) error {
		rel, err = in.forceRelease(ctx, agent, key)
		return err
	})
	return rel, err
}

func (in *Inspector) forceRelease(ctx context.Context, agent, issue string) (Released, error) {
	li, err := in.Lease(ctx, agent, issue)
	if errors.Is(err, ErrNotFound) {
		key, _ := in.locker.Canonicalize(issue)
		return Released{Agent: agent, Issue: key}, nil
	}
	if err != nil {
		return Released{}, err
	}
	fence, err := in.locker.ForceRelease(ctx, agent, li.Issue)
	if err != nil {
		return Released{}, err
	}
	return Released{Agent: agent, Issue: li.Issue, Holder: &li, Fence: fence}, nil
}

// canonical returns the canonical form of raw, or raw trimmed when it is not a valid
// key (shown as it is).
func (in *Inspector) canonical(raw string) (string, bool) {
	k, err := in.locker.Canonicalize(raw)
	if err != nil {
		return strings.TrimSpace(raw), false
	}
	return k, true
}

func fieldStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func isNoGroupErr(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

func isNoSuchKeyErr(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}

// RunningLease is a live lease and the input stream of the entry it guards: the work
// running now, per agent and branch.
type RunningLease struct {
	Lease LeaseInfo `json:"lease"`
	// Stream, Branch and Todo name the input stream holding the guarded entry; empty
	// when the entry is in none of the agent's streams (trimmed, or a plain lock).
	Stream string `json:"stream,omitempty"`
	Branch string `json:"branch,omitempty"`
	Todo   bool   `json:"todo"`
}

// Running returns the live leases (Locks without a filter) with the stream of each
// one's guarded entry.
//
// Cost: Locks, then one round trip: XRANGE id id on each of the agent's input streams
// per lease, pipelined.
func (in *Inspector) Running(ctx context.Context) ([]RunningLease, error) {
	leases, err := in.Locks(ctx, LockFilter{})
	if err != nil {
		return nil, err
	}
	out := make([]RunningLease, len(leases))
	type probe struct {
		lease int
		route event.Route
		cmd   *redis.XMessageSliceCmd
	}
	var probes []probe
	pipe := in.rdb.Pipeline()
	for i, l := range leases {
		out[i].Lease = l
		if CheckID(l.MessageID) != nil {
			continue
		}
		for _, r := range in.topo.AllInputs() {
			// The lease names its entry's stream (else any of the agent's may hold it): the
			// other streams' entries of that id are other events.
			if r.Agent == l.Agent && (l.Stream == "" || r.Stream == l.Stream) {
				probes = append(probes, probe{i, r, pipe.XRangeN(ctx, r.Stream, l.MessageID, l.MessageID, 1)})
			}
		}
	}
	if len(probes) == 0 {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("xrange: %w", err)
	}
	for _, p := range probes {
		if len(p.cmd.Val()) > 0 {
			out[p.lease].Stream, out[p.lease].Branch, out[p.lease].Todo = p.route.Stream, p.route.Branch, p.route.Todo
		}
	}
	return out, nil
}
