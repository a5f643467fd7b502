package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Defaults, taken from the Python lock where it had one.
const (
	// DefaultTTL is Options.TTL's default.
	DefaultTTL = 300 * time.Second
	// DefaultMaxHold is Options.MaxHold's default.
	DefaultMaxHold = 6 * time.Hour
	// MinTTL is the shortest Options.TTL New accepts: the heartbeat (TTL/3) must have
	// time for a round trip.
	MinTTL = 30 * time.Millisecond
)

// DefaultSafetyMargin is Options.SafetyMargin's default for ttl (TTL/10): a lease is
// given up that long before its key can expire, so whatever the holder runs must be
// stopped within it (a runner's kill grace must fit in it).
func DefaultSafetyMargin(ttl time.Duration) time.Duration { return ttl / 10 }

// HeartbeatFor is the heartbeat interval of a lease with this ttl (TTL/3). A
// subscriber's claim threshold (its MaxIdleTime) must exceed it.
func HeartbeatFor(ttl time.Duration) time.Duration { return ttl / 3 }

// Observer is told about lease events, for metrics. Methods must be fast and safe for
// concurrent use.
type Observer interface {
	Acquired(agent string)
	Busy(agent string)
	Lost(agent string, cause error)
	Released(agent string, held time.Duration)
	// Conflict is told what the middleware did with an event whose issue was busy:
	// outcome "dropped" (reason "locked" or "superseded"), "coalesced" or "delayed".
	Conflict(agent, outcome, reason string)
}

type nopObserver struct{}

func (nopObserver) Acquired(string)                 {}
func (nopObserver) Busy(string)                     {}
func (nopObserver) Conflict(string, string, string) {}
func (nopObserver) Lost(string, error)              {}
func (nopObserver) Released(string, time.Duration)  {}

// Options configure a Locker. The zero value is usable: New fills in the defaults and
// checks the rest, once.
type Options struct {
	// TTL of the lease key; the heartbeat extends it every TTL/3. At least MinTTL.
	// Default: 300s (DefaultTTL).
	TTL time.Duration
	// SafetyMargin is taken off TTL when deciding that a lease can no longer be proven:
	// it covers clock drift between us and Redis and the time an extend is in flight.
	// In [0, 2/3 of TTL). Default: TTL/10 (DefaultSafetyMargin).
	SafetyMargin time.Duration
	// MaxHold caps how long one lease may be held; not negative. Default: 6h
	// (DefaultMaxHold).
	MaxHold time.Duration
	// KeyPattern validates canonical keys. Default: DefaultKeyPattern.
	KeyPattern *regexp.Regexp
	// Format of the Redis keys. Default: KeysCompat (Python-compatible).
	Format KeyFormat
	// Scope is put before the agent in every key (e.g. "staging:") so that several
	// pipelines can share one Redis. Default: "" (the Python-compatible keys).
	Scope string
	// Owner names the holder in the lease record (a consumer name). Default: host:pid.
	Owner string
	// Logger for lost leases and failed releases. Default: the zero Logger, which
	// writes nothing.
	Logger zerolog.Logger
	// Observer receives lease events. Default: none.
	Observer Observer
	// WaitReplicas, when above 0, makes every acquire and extend wait until that many
	// replicas have acknowledged it (WAIT; see replicas.go): an acquire they do not
	// acknowledge within WaitTimeout is given back and refused with an error wrapping
	// ErrNotReplicated, an extend they do not acknowledge does not count (the lease ends
	// unproven if none does for TTL minus the safety margin). Default: 0 (no waiting:
	// replication is asynchronous).
	WaitReplicas int
	// WaitTimeout bounds each WAIT; in (0, TTL/3). Default: min(1s, TTL/10)
	// (defaultWaitTimeout).
	WaitTimeout time.Duration
	// WaitAOF sends WAITAOF 0 WaitReplicas instead of WAIT: a replica acknowledges once
	// the write is in its append-only file (replicas need appendonly yes). Redis 7.2 or
	// later (CheckReplicas tells). Default: false.
	WaitAOF bool
}

// Client is what the lease needs of a Redis client: scripts (EVALSHA, EVAL, and
// Process for the hot path's own script commands), pipelines, GET (Check), SCAN (List)
// and SUBSCRIBE (WatchEvictions). redis.UniversalClient satisfies it, and so do
// *redis.Client and *redis.ClusterClient.
type Client interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
	Get(ctx context.Context, key string) *redis.StringCmd
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Locker hands out per-issue leases. It is safe for concurrent use.
type Locker struct {
	rdb   Client
	opts  Options
	ttlMS int64 // opts.TTL in ms, for the scripts' arguments (by pointer)
	// starter starts the heartbeats of the leases held long enough to need one.
	starter starter
	// evict ends leases at once when a force release evicts them (WatchEvictions).
	evict evictions
	// lagging: the last confirmation of an acquire found too few replicas (Options.
	// WaitReplicas); acquires probe them first (probeReplicas).
	lagging atomic.Bool
}

// New returns a Locker on rdb. It does no I/O.
func New(rdb Client, opts Options) (*Locker, error) {
	if rdb == nil {
		return nil, errors.New("lease: New needs a Redis client")
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.TTL < MinTTL {
		return nil, fmt.Errorf("lease: Options.TTL must be at least %s, got %s", MinTTL, opts.TTL)
	}
	if opts.SafetyMargin == 0 {
		opts.SafetyMargin = DefaultSafetyMargin(opts.TTL)
	}
	if opts.SafetyMargin < 0 || opts.SafetyMargin >= opts.TTL*2/3 {
		return nil, fmt.Errorf("lease: Options.SafetyMargin must be in [0, 2/3 of Options.TTL %s), got %s", opts.TTL, opts.SafetyMargin)
	}
	if opts.MaxHold == 0 {
		opts.MaxHold = DefaultMaxHold
	}
	if opts.MaxHold < 0 {
		return nil, fmt.Errorf("lease: Options.MaxHold must not be negative, got %s", opts.MaxHold)
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
	if opts.WaitReplicas < 0 {
		return nil, fmt.Errorf("lease: Options.WaitReplicas must not be negative, got %d", opts.WaitReplicas)
	}
	if opts.WaitTimeout == 0 {
		opts.WaitTimeout = defaultWaitTimeout(opts.TTL)
	}
	if opts.WaitTimeout < time.Millisecond || opts.WaitTimeout >= opts.TTL/3 {
		return nil, fmt.Errorf("lease: Options.WaitTimeout must be in [1ms, Options.TTL/3 = %s), got %s", opts.TTL/3, opts.WaitTimeout)
	}
	return &Locker{rdb: rdb, opts: opts, ttlMS: opts.TTL.Milliseconds()}, nil
}

// TTL is the lease TTL; settings that must be sized against it (a kill grace, a
// claim threshold) read it here.
func (l *Locker) TTL() time.Duration { return l.opts.TTL }

// Client is the Redis client the Locker was made with, for layers that send their
// own commands beside the lease's (a middleware's XACK).
func (l *Locker) Client() Client { return l.rdb }

// Format is the layout of the Locker's keys (Options.Format).
func (l *Locker) Format() KeyFormat { return l.opts.Format }

// Observer is the Locker's Observer (Options.Observer, or one that ignores
// everything), for layers that report more of its events (a middleware's conflicts).
func (l *Locker) Observer() Observer { return l.opts.Observer }

// HeartbeatInterval is how often a held lease is extended (TTL/3). A subscriber's
// claim threshold must exceed it, or entries whose lease is alive could be claimed.
func (l *Locker) HeartbeatInterval() time.Duration { return HeartbeatFor(l.opts.TTL) }

// Canonicalize returns the canonical form of an issue key under this Locker's
// KeyPattern, or an ErrInvalidKey error: use it to check keys before they are enqueued.
func (l *Locker) Canonicalize(raw string) (string, error) {
	return Canonicalize(raw, l.opts.KeyPattern)
}

// Keys returns the Redis keys of the lease (agent, issue); issue must be canonical. For
// tools and tests that look at Redis directly.
func (l *Locker) Keys(agent, issue string) Keys {
	return l.opts.Format.keysFor(l.opts.Scope+agent, issue, "")
}

// LockKey is Keys(agent, issue).Lock, without building the other names.
func (l *Locker) LockKey(agent, issue string) string {
	return l.opts.Format.lockKey(l.opts.Scope+agent, issue)
}

// AcquireOptions are per-acquire settings. The zero value takes a plain lease.
type AcquireOptions struct {
	// Owner overrides Options.Owner for this lease (the consumer name). Default:
	// Options.Owner.
	Owner string
	// MessageID is the stream entry the lease guards, shown to operators. Default: "".
	MessageID string
	// Stream is the stream of MessageID's entry: a worker reads an agent's stream and
	// its :todo twin, whose entry ids repeat, and only the holder's own entry (the same
	// id in the same stream) is taken for it (LockedError.Own). The lease's record keeps
	// it. Default: "" (the entry is told by its id alone).
	Stream string
	// OnHeartbeat queues extra commands on the heartbeat's pipeline, so they cost no
	// extra round trip (the middleware keeps its stream entry fresh this way). Default:
	// nil (the heartbeat only extends).
	OnHeartbeat func(ctx context.Context, pipe redis.Pipeliner)
	// Queue, when set, selects the coalesce policy: if the lease is held, the event is
	// stored as the issue's single queued follow-up (replacing an older one) in the same
	// atomic step, and the LockedError says Queued. Whoever releases the lease next
	// appends it to Queue.Stream. Default: nil (a busy lease is only reported).
	Queue *QueuedEvent
	// Deliver, when set, selects the deliver policy: if the lease is held, the event's
	// follow-up record is appended to the holder's mailbox and the event kept as the
	// issue's queued event, in the same atomic step; the LockedError says Delivered,
	// or Acquire returns an error wrapping ErrMailboxFull. Queue is then ignored.
	// Default: nil.
	Deliver *DeliverOptions
	// Drain says the lease expects queued follow-ups (a coalesce or deliver rule is in
	// use): Handoff then takes nothing ahead. Every release publishes the queued
	// follow-up it finds, whatever Drain says: whether to drain is the key's own state
	// (a queue exists), so a holder that took the lease over, or that did not expect a
	// follow-up, strands none. Default: false.
	Drain bool
	// MaxLen trims the stream a drained follow-up is appended to (approximate).
	// Default: 0 (no trim).
	MaxLen int64
	// EntryTime, when set, is when the event entered its stream (the ms part of its
	// stream id). If another event's run of the issue was released after that, Acquire
	// refuses with a *SupersededError: the event waited while the issue was being worked
	// on and counts as dropped (policy drop). Retries of the same message are exempt.
	// Default: the zero Time (no check).
	EntryTime time.Time
	// Supersede selects the supersede policy: if the lease is held by the run of an
	// older event (a lower stream id than MessageID), that run is superseded in the same
	// atomic step: the lease is taken over with a new token and a higher fence (the old
	// holder's fenced writes are refused from then on), the take-over is announced on
	// EvictionChannel (a Locker that watches evictions ends the old lease at once, with
	// a *SupersededByError; any other at its next heartbeat), and the new lease's
	// WaitStopped returns once the old run has stopped (its holder released) or its key
	// would have expired. A holder with a newer event, the same entry, or no message id
	// is reported busy (LockedError.Newer tells the first). Requires MessageID; cannot
	// be combined with Queue, Deliver or Shared. The lease's release publishes the
	// follow-up queued behind it or behind the run it took over. Default: false.
	Supersede bool
	// Shared are the lease's shared keys (scopes issue and group; Scopes.Keys makes
	// them), taken with it in one script, all or nothing, and released with it (on Redis
	// Cluster a group key is in a slot of its own: taken by a second script right after
	// the lease's own key, which is given back, unrecorded, when the group key is busy). A busy
	// shared key is reported as a *LockedError whose Holder names its scope and key.
	// Queue and Drain cannot be combined with it (a follow-up queued behind another
	// agent's shared key would have nobody to publish it). On Redis Cluster at most one
	// (CheckScopes). Default: none (scope agent alone).
	Shared []ScopeKey
	// Wait, when set, selects the wait policy (line.go): if the key is busy, the event
	// joins its FIFO line (acked in the same script on standalone Redis) and the
	// LockedError says Waited; the release that frees the key hands it to the head of
	// the line. With one shared key (scope issue or group) the line is the shared key's,
	// whichever agent or issue holds it, and the event's turn takes both keys
	// (line_scoped.go); with two it is refused. Cannot be combined with Queue, Deliver or
	// Supersede. Default: nil.
	Wait *WaitOptions
	// LineHold, when above 0, says the key may have a line (a wait rule is in use beside
	// this lease's own policy): the lease's release hands the key to the line's head, as
	// a wait lease's does, so no release of the key misses it (WaitOptions.Hold).
	// Default: 0.
	LineHold time.Duration
	// Slots, on standalone Redis, are the run's concurrency limits (RUN_LIMITS): the
	// acquire takes a slot of each of Slots.Limits with the lease, in its one script,
	// all or nothing, whatever the policy (slots_lease.go). When a key is full and the
	// lease could be the run's, nothing is taken and the event waits in that key's line
	// (a *SlotsWaitingError; acked in the script when Slots.Ack is set); when the lease
	// is busy, the policy decides and no slot is taken. The lease's extend renews the
	// slots and its release frees them, each handed to its key's next waiter. Refused
	// on Redis Cluster (TakeSlots there). Default: nil (no limit).
	Slots *SlotRequest
}

// DeliverOptions are the deliver policy's part of an acquire.
type DeliverOptions struct {
	// Followup is the mailbox entry's fields (what the run is told). None for a
	// wake-up: an event that stands for the mailbox's follow-ups (a release republished
	// it for them). It is never appended: a busy lease keeps it as its queued event
	// (the LockedError says Queued), and a free lease with an empty mailbox (a run
	// accounted for them all since) is not taken (a LockedError naming the last
	// released message, neither Queued nor Delivered: dropped). Default: none.
	Followup map[string]any
	// Event is the event itself, queued to start the issue's next run if the holder
	// does not account for every follow-up. Required.
	Event QueuedEvent
	// MaxDepth bounds the mailbox: an event that finds it this full is refused with an
	// error wrapping ErrMailboxFull. Default: DefaultMailboxDepth.
	MaxDepth int64
}

// DefaultMailboxDepth is DeliverOptions.MaxDepth's default.
const DefaultMailboxDepth = 100

// mailboxTTL is how long a mailbox (and its seen set) lives after its last append, at
// least MaxHold+TTL: long after the lease, because the event a release republishes for
// its follow-ups may wait that long in a backlog before its run reads them. A run that
// accounts for every follow-up deletes it sooner.
const mailboxTTL = 7 * 24 * time.Hour

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
	if l.opts.WaitReplicas > 0 && l.lagging.Load() {
		// Before any key is taken or any line joined: a wait acquire is no exception.
		if err := l.probeReplicas(ctx, a.keys); err != nil {
			return nil, err
		}
	}
	if ao.Wait != nil {
		return l.acquireWait(ctx, a)
	}
	var res []any
	switch {
	case a.apart:
		res, err = l.acquireApart(ctx, a)
	case len(a.shared) > 0:
		res, err = a.run(ctx, acquireScopedScript, a.scriptKeys(), a.args)
	case ao.Deliver != nil:
		res, err = a.run(ctx, acquireOrDeliverScript, a.scriptKeys(), a.args)
	case ao.Supersede:
		res, err = a.run(ctx, acquireOrSupersede, a.scriptKeys(), a.args)
		if err == nil && len(res) >= 5 && atoi(res[0]) == 1 && res[3] != "" {
			// Announced after the take-over, not in its script: an announcement is only
			// a shortcut (the old holder's heartbeat finds the key taken anyway), so a
			// server or ACL that refuses PUBLISH must not fail the take-over. A repeat
			// announces again, which ends nothing twice.
			l.announceSupersede(ctx, a.keys.Lock, atoi(res[1]), a.ao.MessageID)
		}
	case ao.Queue == nil && a.slots == nil:
		res, err = runScript(ctx, l.rdb, acquireScript, kvKeys, append(scriptArgs(len(a.kv)), a.kv[:]...)).Slice()
	case ao.Queue == nil:
		res, err = a.run(ctx, acquireScript, a.scriptKeys(), a.args)
	default:
		res, err = a.run(ctx, acquireOrQueueScript, a.scriptKeys(), a.args)
	}
	le, err := a.finish(ctx, res, err)
	if err != nil {
		return nil, err
	}
	if err := le.replicated(ctx); err != nil {
		return nil, err
	}
	return le, nil
}

// acquisition is one acquire between sending the script and reading its reply.
type acquisition struct {
	l                   *Locker
	agent, issue, owner string
	token               string
	keys                Keys
	sent                time.Time
	ao                  AcquireOptions
	sentMS              int64
	entryMS             string
	mid                 string // the scripts' message_id: ao.MessageID with its stream (entryName)
	// kv is the acquire script's KEYS (lock, info, fence, done, stop: kvKeys) and ARGV
	// (token, ttl_ms, owner, acquired_at_ms, message_id, entry_ms) as pointers to the
	// fields above, which go-redis writes as their values: an argument boxed in an
	// interface is an allocation, a pointer is not.
	kv   [kvKeys + 6]any
	args []any // the ARGV of a.scriptKeys()'s script: kv[kvKeys:], or acquire_or_queue's
	// shared are the shared keys' names (Lock, Info and Fence of each), in the order
	// of ao.Shared; nil for a lease of scope agent alone.
	shared []Keys
	// apart: the shared key is in another hash slot than the lease's own keys (a group
	// key on Redis Cluster, Locker.apart), so each is taken by a script of its own.
	apart bool
	// slots: the slots taken with the lease (AcquireOptions.Slots), or nil.
	slots *leaseSlots
}

// errSupersedeOptions refuses a supersede acquire with options it cannot honour.
var errSupersedeOptions = errors.New("lease: AcquireOptions.Supersede needs MessageID and cannot be combined with Queue, Deliver or Shared")

// errSharedQueue refuses shared keys with the coalesce policy's options.
var errSharedQueue = errors.New("lease: AcquireOptions.Shared cannot be combined with AcquireOptions.Queue or Drain")

func (l *Locker) prepare(agent, rawKey string, ao AcquireOptions) (*acquisition, error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return nil, err
	}
	a := &acquisition{l: l, agent: agent, issue: issue, owner: ao.Owner, token: newToken(), sent: time.Now(), ao: ao}
	if ao.Supersede && (ao.Queue != nil || ao.Deliver != nil || len(ao.Shared) > 0 || ao.MessageID == "") {
		return nil, errSupersedeOptions
	}
	if (ao.Wait != nil || ao.LineHold > 0) && len(ao.Shared) > 1 {
		return nil, errWaitShared
	}
	if ao.Slots != nil {
		if a.slots, err = l.newLeaseSlots(ao.Slots, ao.Supersede || ao.Wait != nil); err != nil {
			return nil, err
		}
	}
	if len(ao.Shared) == 0 {
		a.keys = l.Keys(agent, issue)
	} else {
		if ao.Queue != nil || ao.Drain {
			return nil, errSharedQueue
		}
		if l.opts.Format == KeysCluster && len(ao.Shared) > 1 {
			return nil, fmt.Errorf("%w: AcquireOptions.Shared: on Redis Cluster a lease holds at most one shared key", ErrBadScope)
		}
		a.keys = l.scopedKeys(agent, issue, ao.Shared)
		a.apart = l.apart(ao.Shared)
		for _, sk := range ao.Shared {
			a.shared = append(a.shared, l.SharedKeys(sk))
		}
	}
	if a.owner == "" {
		a.owner = l.opts.Owner
	}
	entryMS := ""
	if !ao.EntryTime.IsZero() {
		entryMS = strconv.FormatInt(ao.EntryTime.UnixMilli(), 10)
	}
	a.sentMS, a.entryMS, a.mid = a.sent.UnixMilli(), entryMS, entryName(ao.MessageID, ao.Stream)
	a.kv = [...]any{&a.keys.Lock, &a.keys.Info, &a.keys.Fence, &a.keys.Done, &a.keys.Stop,
		&a.token, &l.ttlMS, &a.owner, &a.sentMS, &a.mid, &a.entryMS}
	switch {
	case len(a.shared) > 0:
		a.args = []any{a.token, l.ttlMS, a.owner, a.sentMS, a.mid, entryMS, agent, issue}
	case ao.Deliver != nil:
		d := ao.Deliver
		depth := d.MaxDepth
		if depth <= 0 {
			depth = DefaultMailboxDepth
		}
		a.args = []any{a.token, l.opts.TTL.Milliseconds(), a.owner, a.sent.UnixMilli(), a.mid,
			(l.opts.MaxHold + l.opts.TTL).Milliseconds(), d.Event.Stream, entryMS, depth, 2 * len(d.Followup),
			max(mailboxTTL, l.opts.MaxHold+l.opts.TTL).Milliseconds()}
		for k, v := range d.Followup {
			a.args = append(a.args, k, v)
		}
		for k, v := range d.Event.Fields {
			a.args = append(a.args, k, v)
		}
	case ao.Queue == nil:
		a.args = a.kv[kvKeys:]
	default:
		a.args = []any{a.token, l.opts.TTL.Milliseconds(), a.owner, a.sent.UnixMilli(), a.mid,
			(l.opts.MaxHold + l.opts.TTL).Milliseconds(), ao.Queue.Stream, entryMS}
		for k, v := range ao.Queue.Fields {
			a.args = append(a.args, k, v)
		}
	}
	return a, nil
}

// kvKeys is how many of acquisition.kv are KEYS.
const kvKeys = 5

// stoppingAt is where the acquire's script puts, in a grant ({1, fence, shared fences
// ...}), the runs still stopping on the key (granted_stopping in lease.lua): after the
// shared keys' fences. -1 for supersede, whose reply has them in a place of its own. A
// reply without them (none is expected) leaves WaitStopped to ask.
func (a *acquisition) stoppingAt() int {
	if a.ao.Supersede {
		return -1
	}
	return 2 + len(a.shared)
}

func (a *acquisition) scriptKeys() []string {
	if len(a.shared) > 0 {
		keys := []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Done, a.keys.Stop}
		for _, k := range a.shared {
			keys = append(keys, k.Lock, k.Info, k.Fence)
		}
		return keys

	}
	if a.ao.Deliver != nil {
		return []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Queue, a.keys.Done, a.keys.Mailbox, a.keys.Mailbox + ":seen", a.keys.Stop}
	}
	if a.ao.Queue == nil {
		return []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Done, a.keys.Stop}
	}
	return []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Queue, a.keys.Done, a.keys.Stop}
}

// run sends an acquire script, or its combined script with the slots' part
// (AcquireOptions.Slots).
func (a *acquisition) run(ctx context.Context, sc script, keys []string, args []any) ([]any, error) {
	if a.slots != nil {
		return a.slots.run(ctx, a.l.rdb, sc, keys, args)
	}
	return sc.Run(ctx, a.l.rdb, keys, args...).Slice()
}

// acquireApart takes a lease whose shared key is in another hash slot (a group key on
// Redis Cluster): the lease's own keys first (acquire_scoped.lua with none shared: the
// superseded check and a busy lease's reply are theirs), then the shared key
// (acquire_shared.lua). When the shared key is busy, or its script fails, the lease's
// own key is given back without a release record (no run happened under it) and the
// shared key's reply is the acquire's. It returns the reply finish reads: {1, fence,
// shared fence} once both are held.
func (l *Locker) acquireApart(ctx context.Context, a *acquisition) ([]any, error) {
	own := []string{a.keys.Lock, a.keys.Info, a.keys.Fence, a.keys.Done, a.keys.Stop}
	res, err := acquireScopedScript.Run(ctx, l.rdb, own, a.args...).Slice()
	if err != nil || len(res) < 2 || atoi(res[0]) != 1 {
		return res, err
	}
	sk := a.shared[0]
	sres, err := acquireSharedScript.Run(ctx, l.rdb, []string{sk.Lock, sk.Info, sk.Fence},
		a.token, l.ttlMS, a.owner, a.sentMS, a.mid, a.agent, a.issue).Slice()
	if err == nil && len(sres) >= 2 && atoi(sres[0]) == 1 {
		return append([]any{res[0], res[1], sres[1]}, res[2:]...), nil // res[2]: granted_stopping's count
	}
	// Given back in the background of the caller's context: the caller hears busy (or
	// the error) either way, and a failed give-back leaves the key to its TTL.
	gctx := context.WithoutCancel(ctx)
	if err != nil {
		// A lost reply may have taken the shared key all the same.
		_ = unlockSharedScript.Run(gctx, l.rdb, []string{sk.Lock, sk.Info}, a.token).Err()
	}
	a.giveBackOwn(gctx)
	return sres, err
}

// giveBackOwn gives back the agent's own key of an acquire that failed on a key held
// apart, through the one release step (outcome given back: no run recorded, a queued
// follow-up still published). A failure leaves the key to its TTL.
func (a *acquisition) giveBackOwn(ctx context.Context) {
	le := &Lease{l: a.l, agent: a.agent, issue: a.issue, keys: a.keys, token: a.token,
		messageID: a.ao.MessageID, entry: a.mid, maxLen: a.ao.MaxLen}
	res, err := le.runRelease(ctx, outcomeGivenBack, "", "").Slice()
	_, _ = le.releaseScripted(ctx, outcomeGivenBack, res, err)
}

// finish turns the acquire script's reply into a held Lease (its heartbeat started and
// its context derived from parent) or the error saying why not.
func (a *acquisition) finish(parent context.Context, res []any, err error) (*Lease, error) {
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %s: %w", a.keys.Lock, err)
	}
	if len(res) < 2 {
		return nil, fmt.Errorf("lease: acquire %s: unexpected reply %v", a.keys.Lock, res)
	}
	if n, _ := res[0].(int64); n == 2 && len(res) >= 3 {
		a.l.opts.Observer.Busy(a.agent)
		by, _ := res[2].(string)
		return nil, &SupersededError{Agent: a.agent, Issue: a.issue, ReleasedAt: time.UnixMilli(atoi(res[1])), ByMessageID: by}
	}
	if n, _ := res[0].(int64); n != 1 {
		a.l.opts.Observer.Busy(a.agent)
		return nil, a.busy(n, res)
	}
	return a.held(parent, res), nil
}

// busy is the error of an acquire the script answered busy (reply code n): the mailbox
// full, or a LockedError saying what became of the event (queued, delivered, ...).
func (a *acquisition) busy(n int64, res []any) error {
	var full *mailboxFullError
	if n == 3 && len(res) >= 7 { // deliver: the mailbox is full
		full = &mailboxFullError{Depth: atoi(res[1])}
		res = res[1:]
	}
	holder := a.holderOf(res)
	if full != nil {
		full.Holder = holder
		return full
	}
	return a.lockedError(holder, res)
}

// holderOf reads the holder of the busy key from a busy reply (its fields from index 1).
func (a *acquisition) holderOf(res []any) Info {
	holder := Info{Agent: a.agent, Issue: a.issue, Scope: ScopeAgent, Key: a.issue}
	if len(res) >= 10 { // a busy shared key: its holder may be another agent, on another issue
		holder.Agent, _ = res[7].(string)
		holder.Issue, _ = res[9].(string)
		lock, _ := res[8].(string)
		for i, k := range a.shared {
			if k.Lock == lock {
				holder.Scope, holder.Key = a.ao.Shared[i].Scope, a.ao.Shared[i].Key
			}
		}
	}
	holderFields(res, &holder)
	return holder
}

// holderEntry is the entry a busy reply's holder runs, as the script names it (with
// its stream when the holder's record has one: holder_busy).
func holderEntry(res []any) string {
	if len(res) < 6 {
		return ""
	}
	e, _ := res[4].(string)
	return e
}

// holderFields reads a busy reply's holder fields (holder_busy in lease.lua: owner,
// fence, acquired_at, message_id, pttl from res[1]) into holder, when the reply has them.
func holderFields(res []any, holder *Info) {
	if len(res) < 6 {
		return
	}
	holder.Owner, _ = res[1].(string)
	holder.Fence = atoi(res[2])
	if ms := atoi(res[3]); ms > 0 {
		holder.AcquiredAt = time.UnixMilli(ms)
	}
	mid, _ := res[4].(string)
	holder.MessageID = lineEventID(mid) // a key reserved for its line's head names its member
	if ttl := atoi(res[5]); ttl > 0 {
		holder.TTL = time.Duration(ttl) * time.Millisecond
	}
}

// lockedError is the LockedError of a busy reply, by what the acquire asked for: its own
// entry, a wake-up, a delivery to the mailbox, a supersede, or a queue.
func (a *acquisition) lockedError(holder Info, res []any) *LockedError {
	issue := a.issue
	if a.ao.MessageID != "" && holder.Scope == ScopeAgent && sameEntry(holderEntry(res), a.mid) {
		// The holder's own entry: the scripts neither queue, deliver nor ack it.
		return &LockedError{Holder: holder, Issue: issue, Own: true}
	}
	if a.ao.Deliver != nil {
		if a.ao.Deliver.Followup == nil {
			// A wake-up: kept as the queued event (dup 1), or nothing left to wake for.
			return &LockedError{Holder: holder, Issue: issue, Queued: len(res) >= 9 && atoi(res[8]) == 1}
		}
		le := &LockedError{Holder: holder, Issue: issue, Delivered: true}
		if len(res) >= 9 {
			le.MailboxID, _ = res[6].(string)
			le.Depth = atoi(res[7])
			le.Duplicate = atoi(res[8]) == 1
		}
		return le
	}
	if a.ao.Supersede {
		return &LockedError{Holder: holder, Issue: issue, Newer: len(res) >= 7 && atoi(res[6]) == 1}
	}
	le := &LockedError{Holder: holder, Issue: issue, Queued: a.ao.Queue != nil}
	if len(res) >= 7 {
		le.Replaced = atoi(res[6]) > 0
	}
	return le
}

// held builds the Lease an acquire won from its reply (the fences of its shared keys,
// its line, what it supersedes), derives its context from parent and starts its heartbeat.
func (a *acquisition) held(parent context.Context, res []any) *Lease {
	l := a.l
	le := &Lease{
		l:          l,
		agent:      a.agent,
		issue:      a.issue,
		keys:       a.keys,
		token:      a.token,
		messageID:  a.ao.MessageID,
		entry:      a.mid,
		fence:      atoi(res[1]),
		acquiredAt: a.sent,
		onBeat:     a.ao.OnHeartbeat,
		drain:      a.ao.Drain,
		maxLen:     a.ao.MaxLen,
		apart:      a.apart,
		slots:      a.slots,
	}
	if len(a.shared) > 0 {
		le.shared = make([]SharedLease, len(a.shared))
		for i, k := range a.shared {
			le.shared[i] = SharedLease{ScopeKey: a.ao.Shared[i], Keys: k}
			if len(res) > 2+i {
				le.shared[i].Fence = atoi(res[2+i])
			}
		}
	}
	if a.ao.LineHold > 0 {
		le.line = &lineLease{lid: a.ao.MessageID, hold: l.holdOf(&WaitOptions{Hold: a.ao.LineHold}), keys: a.keys.Line()}
		if len(le.shared) == 1 {
			// The key's line is its shared key's (line_scoped.go).
			le.line.keys, le.line.shared = le.shared[0].Keys.Line(), true
		}
	}
	switch {
	case a.ao.Supersede && len(res) >= 5:
		le.stopping = atoi(res[2])
		le.supersedes, _ = res[3].(string)
	case a.stoppingAt() >= 0 && len(res) > a.stoppingAt():
		le.stopping = atoi(res[a.stoppingAt()]) // granted_stopping
	default:
		le.stopping = -1 // its script did not tell: WaitStopped asks
	}
	// Tied to parent, not derived from it, so that Unbind can untie it: a run whose
	// release waits for a batch outlives its message's context (lockmw batch.go).
	le.ctx, le.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	if parent.Done() != nil {
		le.unbind = context.AfterFunc(parent, func() { le.cancel(context.Cause(parent)) })
	}
	l.opts.Observer.Acquired(a.agent)
	l.evict.track(le)
	le.startHeartbeatLater()
	return le
}
