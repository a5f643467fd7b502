package lockmw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Defaults, taken from the Python lock where it had one.
const (
	DefaultTTL     = 300 * time.Second
	DefaultMaxHold = 6 * time.Hour
)

// Sentinel errors. Causes of a lease context's cancellation are wrapped around the
// first four; check them with errors.Is(context.Cause(ctx), ErrLeaseLost).
var (
	// ErrLeaseLost: Redis says the lease is not ours any more (expired and maybe taken,
	// or force-released by an operator).
	ErrLeaseLost = errors.New("lockmw: lease lost")
	// ErrLeaseUnproven: no extend has succeeded for TTL minus the safety margin, so the
	// key may have expired on the server (Redis unreachable or too slow).
	ErrLeaseUnproven = errors.New("lockmw: lease unproven")
	// ErrMaxHold: the lease was held for longer than MaxHold; a wedged holder gives up.
	ErrMaxHold = errors.New("lockmw: lease held past its maximum hold")
	// ErrReleased: the holder released the lease.
	ErrReleased = errors.New("lockmw: lease released")
	// ErrLocked is wrapped by *LockedError when another holder has the lease.
	ErrLocked = errors.New("lockmw: issue is locked by another holder")
	// ErrSuperseded is wrapped by *SupersededError: the event entered its stream before
	// another event's run of the same issue ended (AcquireOptions.EntryTime).
	ErrSuperseded = errors.New("lockmw: event superseded by a later run")
)

// SupersededError names the run that superseded an event.
type SupersededError struct {
	Agent, Issue string
	ReleasedAt   time.Time
	ByMessageID  string
}

func (e *SupersededError) Error() string {
	return fmt.Sprintf("%v: %s:%s was worked on by message %s until %s", ErrSuperseded, e.Agent, e.Issue,
		e.ByMessageID, e.ReleasedAt.UTC().Format(time.RFC3339Nano))
}

func (e *SupersededError) Unwrap() error { return ErrSuperseded }

// LockedError says who holds the lease that Acquire could not take.
type LockedError struct {
	Holder Info
	// Queued: the event was stored as the issue's follow-up (coalesce policy);
	// Replaced: it replaced an older queued one.
	Queued, Replaced bool
	superseded       bool
}

func (e *LockedError) Error() string {
	h := e.Holder
	if h.Owner == "" {
		return fmt.Sprintf("%v: %s:%s (holder unknown: a plain lock key, e.g. a Python agent's)", ErrLocked, h.Agent, h.Issue)
	}
	return fmt.Sprintf("%v: %s:%s held by %s (fence %d)", ErrLocked, h.Agent, h.Issue, h.Owner, h.Fence)
}

func (e *LockedError) Unwrap() error { return ErrLocked }

// Info is the operator's view of a lease.
type Info struct {
	Agent      string
	Issue      string
	Owner      string
	Fence      int64
	AcquiredAt time.Time
	MessageID  string
	TTL        time.Duration // time left; 0 when unknown
}

// Observer is told about lease events, for metrics. Methods must be fast and safe for
// concurrent use.
type Observer interface {
	Acquired(agent string)
	Busy(agent string)
	Lost(agent string, cause error)
	Released(agent string, held time.Duration)
	// Conflict is told what the middleware did with an event whose issue was busy:
	// outcome "dropped" (reason "locked" or "superseded") or "coalesced".
	Conflict(agent, outcome, reason string)
}

type nopObserver struct{}

func (nopObserver) Acquired(string)                 {}
func (nopObserver) Busy(string)                     {}
func (nopObserver) Conflict(string, string, string) {}
func (nopObserver) Lost(string, error)              {}
func (nopObserver) Released(string, time.Duration)  {}

// Options configure a Locker. The zero value is usable: defaults are filled in by New.
type Options struct {
	// TTL of the lease key; the heartbeat extends it every TTL/3. Default 300s.
	TTL time.Duration
	// SafetyMargin is taken off TTL when deciding that a lease can no longer be proven:
	// it covers clock drift between us and Redis and the time an extend is in flight.
	// Default TTL/10.
	SafetyMargin time.Duration
	// MaxHold caps how long one lease may be held. Default 6h.
	MaxHold time.Duration
	// KeyPattern validates canonical keys. Default DefaultKeyPattern.
	KeyPattern *regexp.Regexp
	// Format of the Redis keys. Default KeysCompat (Python-compatible).
	Format KeyFormat
	// Scope is put before the agent in every key (e.g. "staging:") so that several
	// pipelines can share one Redis. Empty for the Python-compatible keys.
	Scope string
	// Owner names the holder in the lease record (a consumer name). Default host:pid.
	Owner string
	// Logger for lost leases and failed releases.
	Logger zerolog.Logger
	// Observer receives lease events. Default: none.
	Observer Observer
}

// Locker hands out per-issue leases. It is safe for concurrent use.
type Locker struct {
	rdb  redis.UniversalClient
	opts Options
}

// New returns a Locker on rdb. It does no I/O.
func New(rdb redis.UniversalClient, opts Options) (*Locker, error) {
	if rdb == nil {
		return nil, errors.New("lockmw: nil redis client")
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.TTL < 3*time.Millisecond {
		return nil, fmt.Errorf("lockmw: LOCK_TTL must be at least 3ms, got %s", opts.TTL)
	}
	if opts.SafetyMargin == 0 {
		opts.SafetyMargin = opts.TTL / 10
	}
	if opts.SafetyMargin < 0 || opts.SafetyMargin >= opts.TTL*2/3 {
		return nil, fmt.Errorf("lockmw: safety margin %s must be in [0, 2/3 of LOCK_TTL %s)", opts.SafetyMargin, opts.TTL)
	}
	if opts.MaxHold == 0 {
		opts.MaxHold = DefaultMaxHold
	}
	if opts.MaxHold < 0 {
		return nil, fmt.Errorf("lockmw: LOCK_MAX_HOLD must be positive, got %s", opts.MaxHold)
	}
	if opts.KeyPattern == nil {
		opts.KeyPattern = DefaultKeyPattern
	}
	if opts.Owner == "" {
		host, _ := os.Hostname()
		opts.Owner = host + ":" + strconv.Itoa(os.Getpid())
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	return &Locker{rdb: rdb, opts: opts}, nil
}

// TTL is the lease TTL.
func (l *Locker) TTL() time.Duration { return l.opts.TTL }

// HeartbeatInterval is how often a held lease is extended (TTL/3).
func (l *Locker) HeartbeatInterval() time.Duration { return l.opts.TTL / 3 }

// Canonicalize returns the canonical form of an issue key, or an ErrInvalidKey error.
func (l *Locker) Canonicalize(raw string) (string, error) {
	return Canonicalize(raw, l.opts.KeyPattern)
}

// Keys returns the Redis keys of the lease (agent, issue); issue must be canonical.
func (l *Locker) Keys(agent, issue string) Keys {
	return l.opts.Format.KeysFor(l.opts.Scope+agent, issue)
}

// LockKey is Keys(agent, issue).Lock, without building the other names.
func (l *Locker) LockKey(agent, issue string) string {
	return l.opts.Format.LockKey(l.opts.Scope+agent, issue)
}

// AcquireOptions are per-acquire settings.
type AcquireOptions struct {
	// Owner overrides Options.Owner for this lease (the consumer name).
	Owner string
	// MessageID is the stream entry the lease guards, shown to operators.
	MessageID string
	// OnHeartbeat queues extra commands on the heartbeat's pipeline, so they cost no
	// extra round trip (the middleware keeps its stream entry fresh this way).
	OnHeartbeat func(ctx context.Context, pipe redis.Pipeliner)
	// Queue, when set, selects the coalesce policy: if the lease is held, the event is
	// stored as the issue's single queued follow-up (replacing an older one) in the same
	// atomic step, and the LockedError says Queued. Whoever releases the lease next
	// appends it to Queue.Stream.
	Queue *QueuedEvent
	// Drain makes Release take and publish a queued follow-up (coalesce policy).
	Drain bool
	// MaxLen trims the stream a drained follow-up is appended to (approximate; 0 = no).
	MaxLen int64
	// EntryTime, when set, is when the event entered its stream (the ms part of its
	// stream id). If another event's run of the issue was released after that, Acquire
	// refuses with a *SupersededError: the event waited while the issue was being worked
	// on and counts as dropped (policy drop). Retries of the same message are exempt.
	EntryTime time.Time
}

// QueuedEvent is a stream entry's fields, kept to be appended to Stream later.
type QueuedEvent struct {
	Stream string
	Fields map[string]any
}

// Acquire takes the lease (agent, rawKey) in one round trip. It returns a *LockedError
// (errors.Is(err, ErrLocked)) when another holder has it, and an ErrInvalidKey error,
// without touching Redis, when rawKey is not a valid issue key.
//
// The lease's context derives from ctx and is cancelled with a typed cause when the
// lease is lost, can no longer be proven, passes MaxHold, or is released.
func (l *Locker) Acquire(ctx context.Context, agent, rawKey string, ao AcquireOptions) (*Lease, error) {
	a, err := l.prepare(agent, rawKey, ao)
	if err != nil {
		return nil, err
	}
	var res []any
	if ao.Queue == nil {
		res, err = acquireScript.Run(ctx, l.rdb, a.scriptKeys(), a.args...).Slice()
	} else {
		res, err = acquireOrQueueScript.Run(ctx, l.rdb, a.scriptKeys(), a.args...).Slice()
	}
	return a.finish(ctx, res, err)
}

// acquisition is one acquire between sending the script and reading its reply.
type acquisition struct {
	l                   *Locker
	agent, issue, owner string
	token               string
	keys                Keys
	sent                time.Time
	ao                  AcquireOptions
	args                []any
}

func (l *Locker) prepare(agent, rawKey string, ao AcquireOptions) (*acquisition, error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return nil, err
	}
	a := &acquisition{l: l, agent: agent, issue: issue, owner: ao.Owner, token: newToken(),
		keys: l.Keys(agent, issue), sent: time.Now(), ao: ao}
	if a.owner == "" {
		a.owner = l.opts.Owner
	}
	entryMS := ""
	if !ao.EntryTime.IsZero() {
		entryMS = strconv.FormatInt(ao.EntryTime.UnixMilli(), 10)
	}
	if ao.Queue == nil {
		a.args = []any{a.token, l.opts.TTL.Milliseconds(), a.owner, a.sent.UnixMilli(), ao.MessageID, entryMS}
	} else {
		a.args = []any{a.token, l.opts.TTL.Milliseconds(), a.owner, a.sent.UnixMilli(), ao.MessageID,
			(l.opts.MaxHold + l.opts.TTL).Milliseconds(), ao.Queue.Stream, entryMS}
		for k, v := range ao.Queue.Fields {
			a.args = append(a.args, k, v)
		}
	}
	return a, nil
}

func (a *acquisition) scriptKeys() []string {
	if a.ao.Queue == nil {
		return []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Done}
	}
	return []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Queue, a.keys.Done}
}

// finish turns the acquire script's reply into a held Lease (its heartbeat started and
// its context derived from parent) or the error saying why not.
func (a *acquisition) finish(parent context.Context, res []any, err error) (*Lease, error) {
	l, agent, issue := a.l, a.agent, a.issue
	if err != nil {
		return nil, fmt.Errorf("lockmw: acquire %s: %w", a.keys.Lock, err)
	}
	if len(res) < 2 {
		return nil, fmt.Errorf("lockmw: acquire %s: unexpected reply %v", a.keys.Lock, res)
	}
	if n, _ := res[0].(int64); n == 2 && len(res) >= 3 {
		l.opts.Observer.Busy(agent)
		by, _ := res[2].(string)
		return nil, &SupersededError{Agent: agent, Issue: issue, ReleasedAt: time.UnixMilli(atoi(res[1])), ByMessageID: by}
	}
	if n, _ := res[0].(int64); n != 1 {
		l.opts.Observer.Busy(agent)
		holder := Info{Agent: agent, Issue: issue}
		if len(res) >= 6 {
			holder.Owner, _ = res[1].(string)
			holder.Fence = atoi(res[2])
			if ms := atoi(res[3]); ms > 0 {
				holder.AcquiredAt = time.UnixMilli(ms)
			}
			holder.MessageID, _ = res[4].(string)
			if ttl, _ := res[5].(int64); ttl > 0 {
				holder.TTL = time.Duration(ttl) * time.Millisecond
			}
		}
		le := &LockedError{Holder: holder, Queued: a.ao.Queue != nil}
		if len(res) >= 7 {
			le.Replaced = atoi(res[6]) > 0
		}
		return nil, le
	}
	le := &Lease{
		l:          l,
		agent:      agent,
		issue:      issue,
		keys:       a.keys,
		token:      a.token,
		owner:      a.owner,
		messageID:  a.ao.MessageID,
		fence:      atoi(res[1]),
		acquiredAt: a.sent,
		onBeat:     a.ao.OnHeartbeat,
		drain:      a.ao.Drain,
		maxLen:     a.ao.MaxLen,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	le.ctx, le.cancel = context.WithCancelCause(parent)
	le.log = l.opts.Logger.With().Str("agent", agent).Str("issue_key", issue).
		Int64("fence", le.fence).Str("token", a.token[:8]).Logger()
	l.opts.Observer.Acquired(agent)
	go le.heartbeat(a.sent)
	return le, nil
}

// Handoff names the next event's lease, taken in the same round trip as a release
// (ReleaseAndAcquire).
type Handoff struct {
	Agent, Key string
	Options    AcquireOptions // Queue is not supported here
}

// Pending is a lease taken ahead of its event. Bind it to the event's context with
// Take, or give it back with Release.
type Pending struct {
	Lease *Lease // nil when Err is set
	Err   error  // *LockedError, *SupersededError, an ErrInvalidKey or a Redis error
	stop  func() bool
}

// Take ties the pending lease to ctx (the event's context): cancelling ctx cancels the
// lease's context with ctx's cause, as for a lease acquired under ctx.
func (p *Pending) Take(ctx context.Context) (*Lease, error) {
	if p.Err != nil {
		return nil, p.Err
	}
	le := p.Lease
	p.stop = context.AfterFunc(ctx, func() { le.cancel(context.Cause(ctx)) })
	le.unbind = p.stop
	return le, nil
}

// ReleaseAndAcquire releases le, runs then (an XACK), and acquires next, in this order
// and in one round trip. The pending lease's heartbeat runs from now on; its context is
// detached until Take binds it to its event's context. Both scripts are sent by EVAL,
// so a server that lost its script cache cannot make the round trip half-fail.
func (le *Lease) ReleaseAndAcquire(ctx context.Context, then func(pipe redis.Pipeliner), next Handoff) (bool, *Pending, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	a, prepErr := le.l.prepare(next.Agent, next.Key, next.Options)
	pipe := le.l.rdb.Pipeline()
	rel := releaseScript.Eval(ctx, pipe, []string{le.keys.Lock, le.keys.Info, le.keys.Done}, le.token)
	if then != nil {
		then(pipe)
	}
	var acq *redis.Cmd
	if prepErr == nil {
		acq = acquireScript.Eval(ctx, pipe, a.scriptKeys(), a.args...)
	}
	_, _ = pipe.Exec(ctx)
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	n, err := rel.Int64()
	if err != nil {
		le.log.Warn().Err(err).Dur("expires_within", le.l.opts.TTL).Msg("lease release failed; the key will expire by its TTL")
		err = fmt.Errorf("lockmw: release %s: %w", le.keys.Lock, err)
	}
	p := &Pending{Err: prepErr}
	if prepErr == nil {
		res, aerr := acq.Slice()
		p.Lease, p.Err = a.finish(context.Background(), res, aerr)
	}
	return n == 1, p, err
}

// Inspect returns the live lease (agent, rawKey), or ok=false when nobody holds it.
func (l *Locker) Inspect(ctx context.Context, agent, rawKey string) (info Info, ok bool, err error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return Info{}, false, err
	}
	keys := l.Keys(agent, issue)
	pipe := l.rdb.Pipeline()
	ttl := pipe.PTTL(ctx, keys.Lock)
	h := pipe.HGetAll(ctx, keys.Info)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Info{}, false, fmt.Errorf("lockmw: inspect %s: %w", keys.Lock, err)
	}
	if ttl.Val() == -2 { // go-redis passes PTTL's "no such key" through as -2
		return Info{}, false, nil
	}
	info = infoFromHash(agent, issue, h.Val())
	if ttl.Val() > 0 {
		info.TTL = ttl.Val()
	}
	return info, true, nil
}

// ForceRelease deletes the lease (agent, rawKey) whoever holds it and bumps its fence,
// so the evicted holder's fenced writes are refused. It returns the new fence. Operators
// only: the holder's work is not stopped until its next heartbeat notices.
func (l *Locker) ForceRelease(ctx context.Context, agent, rawKey string) (int64, error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return 0, err
	}
	keys := l.Keys(agent, issue)
	fence, err := forceReleaseScript.Run(ctx, l.rdb, []string{keys.Lock, keys.Info, keys.Fence}).Int64()
	if err != nil {
		return 0, fmt.Errorf("lockmw: force release %s: %w", keys.Lock, err)
	}
	return fence, nil
}

func infoFromHash(agent, issue string, h map[string]string) Info {
	info := Info{Agent: agent, Issue: issue, Owner: h["owner"], MessageID: h["message_id"]}
	info.Fence, _ = strconv.ParseInt(h["fence"], 10, 64)
	if ms, _ := strconv.ParseInt(h["acquired_at"], 10, 64); ms > 0 {
		info.AcquiredAt = time.UnixMilli(ms)
	}
	return info
}

// Lease is a held per-issue lease. Its methods are safe for concurrent use.
type Lease struct {
	l          *Locker
	agent      string
	issue      string
	keys       Keys
	token      string
	owner      string
	messageID  string
	fence      int64
	acquiredAt time.Time
	onBeat     func(context.Context, redis.Pipeliner)
	drain      bool
	maxLen     int64
	log        zerolog.Logger
	requeued   atomic.Value // string: id of the drained follow-up

	ctx    context.Context
	cancel context.CancelCauseFunc
	unbind func() bool // detaches a pending lease from the event context it was bound to

	stopOnce sync.Once
	stop     chan struct{} // closed by Release: heartbeat must end
	done     chan struct{} // closed when the heartbeat has ended
}

// Context is cancelled when the lease ends; context.Cause tells why (ErrLeaseLost,
// ErrLeaseUnproven, ErrMaxHold, ErrReleased, or the parent's cause).
func (le *Lease) Context() context.Context { return le.ctx }

// Fence is this acquisition's fence: greater than every earlier one for the same key.
func (le *Lease) Fence() int64 { return le.fence }

// Agent, Issue, Token, Owner, Keys and AcquiredAt describe the lease.
func (le *Lease) Agent() string         { return le.agent }
func (le *Lease) Issue() string         { return le.issue }
func (le *Lease) Token() string         { return le.token }
func (le *Lease) Owner() string         { return le.owner }
func (le *Lease) Keys() Keys            { return le.keys }
func (le *Lease) AcquiredAt() time.Time { return le.acquiredAt }
func (le *Lease) MessageID() string     { return le.messageID }

// Err is nil while the lease is held, else the cause of its end.
func (le *Lease) Err() error {
	if le.ctx.Err() == nil {
		return nil
	}
	return context.Cause(le.ctx)
}

func (le *Lease) heartbeat(lastOK time.Time) {
	defer close(le.done)
	ttl := le.l.opts.TTL
	interval := ttl / 3
	proven := func(sent time.Time) time.Duration { return time.Until(sent.Add(ttl - le.l.opts.SafetyMargin)) }

	unproven := time.NewTimer(proven(lastOK))
	defer unproven.Stop()
	maxHold := time.NewTimer(time.Until(le.acquiredAt.Add(le.l.opts.MaxHold)))
	defer maxHold.Stop()
	beat := time.NewTimer(interval)
	defer beat.Stop()
	retry := min(interval, 100*time.Millisecond)

	for {
		select {
		case <-le.stop:
			return
		case <-maxHold.C:
			le.end(fmt.Errorf("%w (%s)", ErrMaxHold, le.l.opts.MaxHold))
			return
		case <-unproven.C:
			le.end(fmt.Errorf("%w: no extend succeeded since %s (TTL %s)", ErrLeaseUnproven,
				lastOK.Format(time.RFC3339Nano), ttl))
			return
		case <-beat.C:
		}
		sent := time.Now()
		// An extend that answers after the lease could have expired proves nothing. The
		// client may not honour the deadline while it dials or reads (go-redis without
		// ContextTimeoutEnabled), so the extend runs aside and the deadlines keep
		// ticking here.
		ctx, cancel := context.WithTimeout(context.Background(), max(proven(lastOK), time.Millisecond))
		type reply struct {
			ok  bool
			err error
		}
		replied := make(chan reply, 1)
		go func() {
			ok, err := le.extend(ctx)
			replied <- reply{ok, err}
		}()
		var r reply
		select {
		case r = <-replied:
			cancel()
		case <-le.stop:
			cancel()
			return
		case <-maxHold.C:
			cancel()
			le.end(fmt.Errorf("%w (%s)", ErrMaxHold, le.l.opts.MaxHold))
			return
		case <-unproven.C:
			cancel()
			le.end(fmt.Errorf("%w: no extend succeeded since %s (TTL %s)", ErrLeaseUnproven,
				lastOK.Format(time.RFC3339Nano), ttl))
			return
		}
		ok, err := r.ok, r.err
		switch {
		case err != nil:
			le.log.Warn().Err(err).Dur("retry_in", retry).Msg("lease extend failed; retrying")
			beat.Reset(retry)
			retry = min(retry*2, interval)
		case !ok:
			le.end(fmt.Errorf("%w: extend found %s not ours", ErrLeaseLost, le.keys.Lock))
			return
		default:
			lastOK = sent
			unproven.Reset(proven(lastOK))
			beat.Reset(interval)
			retry = min(interval, 100*time.Millisecond)
		}
	}
}

func (le *Lease) extend(ctx context.Context) (bool, error) {
	if le.onBeat == nil {
		n, err := extendScript.Run(ctx, le.l.rdb, []string{le.keys.Lock, le.keys.Info},
			le.token, le.l.opts.TTL.Milliseconds()).Int64()
		return n == 1, err
	}
	cmds, err := le.pipelined(ctx, []string{le.keys.Lock, le.keys.Info}, func(pipe redis.Pipeliner, script func(*redis.Script) *redis.Cmd) {
		script(extendScript)
		le.onBeat(ctx, pipe)
	}, le.l.opts.TTL.Milliseconds())
	if err != nil {
		return false, err
	}
	n, err := cmds[0].(*redis.Cmd).Int64()
	return n == 1, err
}

// pipelined runs a lease script (KEYS lock, info; ARGV token, extra...) followed by
// the caller's commands in one round trip, by EVALSHA, and again by EVAL if the
// server had lost the script (NOSCRIPT after a restart or SCRIPT FLUSH). Errors of the
// caller's commands are not returned: only the script's and the connection's.
func (le *Lease) pipelined(ctx context.Context, keys []string, fill func(pipe redis.Pipeliner, script func(*redis.Script) *redis.Cmd), extra ...any) ([]redis.Cmder, error) {
	args := append([]any{le.token}, extra...)
	run := func(sha bool) ([]redis.Cmder, error) {
		pipe := le.l.rdb.Pipeline()
		fill(pipe, func(s *redis.Script) *redis.Cmd {
			if sha {
				return s.EvalSha(ctx, pipe, keys, args...)
			}
			return s.Eval(ctx, pipe, keys, args...)
		})
		cmds, err := pipe.Exec(ctx)
		if len(cmds) == 0 {
			return cmds, err
		}
		return cmds, cmds[0].Err()
	}
	cmds, err := run(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmds, err = run(false)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return cmds, err
	}
	return cmds, nil
}

// end cancels the lease context with cause and stops extending; the key then expires on
// its own (or is deleted by Release). Loss is loud: logged at error level and counted.
func (le *Lease) end(cause error) {
	if le.ctx.Err() != nil {
		return
	}
	// Log and count before cancelling, so whoever wakes on the cancellation sees both.
	le.log.Error().Err(cause).Str("message_id", le.messageID).
		Dur("held", time.Since(le.acquiredAt)).Msg("lease lost: holder's context cancelled")
	le.l.opts.Observer.Lost(le.agent, cause)
	le.cancel(cause)
}

func (le *Lease) stopHeartbeat() {
	le.stopOnce.Do(func() {
		close(le.stop)
		if le.unbind != nil {
			le.unbind()
		}
	})
	<-le.done
}

// Release stops the heartbeat and deletes the lease if it is still ours. It is
// idempotent. A failure (Redis down) is logged and returned; the key then expires by
// its TTL. The returned bool says whether this call deleted the key.
func (le *Lease) Release(ctx context.Context) (bool, error) {
	return le.ReleaseWith(ctx, nil)
}

// ReleaseWith is Release with extra commands queued behind the release script in the
// same round trip, executed after it by the server (the middleware acks its stream
// entry this way: release first, then ack, for the price of one round trip).
func (le *Lease) ReleaseWith(ctx context.Context, then func(pipe redis.Pipeliner)) (bool, error) {
	le.stopHeartbeat()
	first := le.ctx.Err() == nil
	le.cancel(ErrReleased)
	var deleted bool
	var err error
	switch {
	case le.drain:
		deleted, err = le.releaseDrain(ctx, then)
	case then == nil:
		var n int64
		n, err = releaseScript.Run(ctx, le.l.rdb, []string{le.keys.Lock, le.keys.Info, le.keys.Done}, le.token).Int64()
		deleted = n == 1
	default:
		var cmds []redis.Cmder
		cmds, err = le.pipelined(ctx, []string{le.keys.Lock, le.keys.Info, le.keys.Done}, func(pipe redis.Pipeliner, script func(*redis.Script) *redis.Cmd) {
			script(releaseScript)
			then(pipe)
		})
		if err == nil {
			n, _ := cmds[0].(*redis.Cmd).Int64()
			deleted = n == 1
		}
	}
	if first {
		le.l.opts.Observer.Released(le.agent, time.Since(le.acquiredAt))
	}
	if err != nil {
		le.log.Warn().Err(err).Dur("expires_within", le.l.opts.TTL).
			Msg("lease release failed; the key will expire by its TTL")
		return false, fmt.Errorf("lockmw: release %s: %w", le.keys.Lock, err)
	}
	return deleted, nil
}

// releaseDrain releases and publishes the queued follow-up (coalesce policy). The
// extra commands run after the release script, in the same round trip.
func (le *Lease) releaseDrain(ctx context.Context, then func(pipe redis.Pipeliner)) (bool, error) {
	inline := le.l.opts.Format != KeysCluster
	pipe := le.l.rdb.Pipeline()
	keys := []string{le.keys.Lock, le.keys.Info, le.keys.Queue, le.keys.Done}
	inl := "0"
	if inline {
		inl = "1"
	}
	cmd := releaseDrainScript.Eval(ctx, pipe, keys, le.token, inl, le.maxLen)
	if then != nil {
		then(pipe)
	}
	if _, err := pipe.Exec(ctx); err != nil && cmd.Err() != nil {
		return false, err
	}
	res, err := cmd.Slice()
	if err != nil {
		return false, err
	}
	deleted := atoi(res[0]) == 1
	if len(res) >= 3 && atoi(res[1]) == 1 {
		le.requeued.Store(fmt.Sprint(res[2]))
	} else if len(res) > 2 { // cluster: the stream is in another slot; publish from here
		values := map[string]any{}
		stream := ""
		for i := 2; i+1 < len(res); i += 2 {
			k, v := fmt.Sprint(res[i]), res[i+1]
			if k == "_stream" {
				stream = fmt.Sprint(v)
				continue
			}
			values[k] = v
		}
		id, err := le.l.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, MaxLen: le.maxLen, Approx: le.maxLen > 0, Values: values}).Result()
		if err != nil {
			return deleted, fmt.Errorf("lockmw: publish queued follow-up to %s: %w", stream, err)
		}
		le.requeued.Store(id)
	}
	return deleted, nil
}

// Requeued is the stream id of the follow-up event that Release published (coalesce
// policy), or "".
func (le *Lease) Requeued() string {
	s, _ := le.requeued.Load().(string)
	return s
}

// Check proves, in one round trip, that the lease is still ours: nil, or an error
// wrapping ErrLeaseLost (also when the heartbeat already gave it up).
func (le *Lease) Check(ctx context.Context) error {
	if err := le.Err(); err != nil && !errors.Is(err, ErrReleased) {
		return fmt.Errorf("%w: %v", ErrLeaseLost, err)
	}
	v, err := le.l.rdb.Get(ctx, le.keys.Lock).Result()
	if errors.Is(err, redis.Nil) || (err == nil && v != le.token) {
		return fmt.Errorf("%w: %s is not ours", ErrLeaseLost, le.keys.Lock)
	}
	if err != nil {
		return fmt.Errorf("lockmw: check %s: %w", le.keys.Lock, err)
	}
	return nil
}

// XAdd appends values to stream only while the lease is held: the check and the append
// are one script, so a holder that lost its lease (expired, taken, force-released)
// cannot publish. maxLen > 0 trims approximately. It returns the new entry's id, or an
// error wrapping ErrLeaseLost. On Redis Cluster (KeysCluster) the stream lives in
// another slot, so the check and the append are two steps there.
func (le *Lease) XAdd(ctx context.Context, stream string, maxLen int64, values map[string]any) (string, error) {
	if err := le.Err(); err != nil && !errors.Is(err, ErrReleased) {
		return "", fmt.Errorf("%w: %v", ErrLeaseLost, err)
	}
	if le.l.opts.Format == KeysCluster {
		if err := le.Check(ctx); err != nil {
			return "", err
		}
		return le.l.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, MaxLen: maxLen, Approx: maxLen > 0, Values: values}).Result()
	}
	args := make([]any, 0, 2+2*len(values))
	args = append(args, le.token, maxLen)
	for k, v := range values {
		args = append(args, k, v)
	}
	id, err := fencedXAddScript.Run(ctx, le.l.rdb, []string{le.keys.Lock, stream}, args...).Text()
	if err != nil {
		if strings.HasPrefix(err.Error(), "LEASELOST") {
			return "", fmt.Errorf("%w: publish to %s refused (fence %d)", ErrLeaseLost, stream, le.fence)
		}
		return "", fmt.Errorf("lockmw: fenced xadd %s: %w", stream, err)
	}
	return id, nil
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func atoi(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
