package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Defaults of RouterConfig's fields.
const (
	DefaultBlockTime     = 5 * time.Second
	DefaultMaxIdleTime   = 3 * time.Minute
	DefaultClaimInterval = 5 * time.Second
	DefaultMaxRetries    = 3
	DefaultReadBatch     = 8
	// MaxReadBatch bounds RouterConfig.ReadBatch: entries read ahead wait in this process.
	MaxReadBatch = 100
)

// RouterConfig configures one worker's router. Client, ClientOptions, Agent (and
// Branch), Consumer, Locker and Handler are required; every other field has a default,
// stated in its comment, taken when the field is left zero. NewRouter validates the
// whole config once; its errors name the field.
type RouterConfig struct {
	// Client is shared by leases, results, dead letters and claim checks. Required.
	Client redis.UniversalClient
	// ClientOptions open each subscriber's own client (a Subscriber closes its
	// client). Required.
	ClientOptions *redis.UniversalOptions
	// Topology names the streams and groups. Default: the namespace
	// event.DefaultNamespace ("ymir").
	Topology event.Topology
	// Agent is the agent whose streams the router reads, one of event.Agents; Branch
	// is its branch (one of event.Branches), empty for triage. Required.
	Agent, Branch string
	// Consumer is the stable consumer name (a pod name); subscription i of each stream
	// reads as "<Consumer>-<i>". Required.
	Consumer string
	// Concurrency is the number of subscriptions per input stream, so of events
	// handled at once per stream. Default: 1.
	Concurrency int
	// BlockTime is how long one XREADGROUP waits for an entry (a shutdown does not wait
	// for it: the subscription's client is closed under it). Default: 5s
	// (DefaultBlockTime).
	BlockTime time.Duration
	// MaxIdleTime is how long an entry stays pending before another consumer may claim
	// it; it must exceed the lease's heartbeat interval (Locker.HeartbeatInterval).
	// Default: 3m (DefaultMaxIdleTime).
	MaxIdleTime time.Duration
	// ClaimInterval is the time between two claim passes. Default: 5s
	// (DefaultClaimInterval).
	ClaimInterval time.Duration
	// NackResendSleep is how long a nacked message waits before it is handed over
	// again. Default: 1s.
	NackResendSleep time.Duration
	// MaxRetries is the number of attempts in all (with exponential backoff from
	// RetryInitial) before an event goes to the dead-letter stream; at least 1.
	// Default: 3 (DefaultMaxRetries).
	MaxRetries int
	// RetryInitial is the wait before the second attempt; each later wait doubles, up
	// to a minute. Default: 1s.
	RetryInitial time.Duration
	// HandlerTimeout bounds one attempt. Default: 0, no bound (the lease's MaxHold
	// still applies).
	HandlerTimeout time.Duration
	// CloseTimeout bounds a graceful shutdown. Default: BlockTime + 11s.
	CloseTimeout time.Duration
	// MaxLen is the length the router keeps its input streams near with event.Trim,
	// and the bound of the results and dead-letter streams' appends. Default: 0, never
	// trimmed (the commands pass event.DefaultMaxLen).
	MaxLen int64
	// ReadBatch is the most entries one XREADGROUP takes while the subscription keeps
	// up with a backlog (1: one entry per read, as Watermill asks), at most
	// MaxReadBatch. Default: 8 (DefaultReadBatch).
	ReadBatch int
	// Policy says what happens to an event whose issue is busy. Default: lockmw.Drop.
	Policy lockmw.Policy
	// Policies, when set, is the busy policy per event type (lockmw.ParsePolicies),
	// Policy then being ignored. With policy delay the router also promotes its input
	// streams' due delayed events. It may name only event.WorkTypes (any other type is
	// a bad event, so its rule would never apply). Default: Policy for every event type.
	Policies lockmw.Policies
	// Scopes are what the agent's leases guard beyond its own key (lockmw.Config.Scopes).
	// Default: scope agent alone.
	Scopes lease.Scopes
	// MailboxDepth bounds each lease's mailbox (Policy lockmw.Deliver). Default:
	// lease.DefaultMailboxDepth.
	MailboxDepth int64
	// Locker takes the per-issue leases and canonicalises issue keys. Required.
	Locker *lease.Locker
	// Logger receives the router's, the subscriptions' and Watermill's lines.
	// Default: the zero zerolog.Logger, which logs nothing.
	Logger zerolog.Logger
	// Metrics counts events, leases and dead letters. Default: nil, nothing counted.
	Metrics *Metrics
	// MaxEventBytes bounds one entry: a bigger one is dead-lettered with a truncated
	// copy, never run. Default: 1 MiB (event.DefaultMaxEventBytes).
	MaxEventBytes int
	// Redactor takes secrets out of what dead letters record. Default: nil, nothing to
	// take out.
	Redactor *redact.Redactor
	// OnDead, when set, is told of every event dead-lettered after the handler failed
	// (not of bad events), with the dead letter's id; it runs after the entry is acked.
	// Default: nil, no one is told.
	OnDead func(ctx context.Context, d Dead)
	// TracerProvider traces each delivery (a consumer span, child of the span that
	// published the entry) and the lease's outcomes on it (docs/architecture.md,
	// "Tracing"). Default: nil, no tracing, and nothing of it on the event's path.
	TracerProvider trace.TracerProvider
	// RunLimit, when set, bounds the run starts of the router's events by a budget
	// every worker of the agent shares (RUN_RATE): an event over it is acked and
	// re-queued in its stream's delayed set until the budget has room, never dropped.
	// Default: nil, no limit.
	RunLimit *RunLimit
	// Limits are the concurrency limits (RUN_LIMITS, RUN_FAIR; lockmw.Config.Limits):
	// at most N runs at once per limit key, shared by every worker; an event over one
	// waits for a slot. Default: none.
	Limits lockmw.Limits
	// Pauses, when set, are checked after each event's lease is taken: an event of a
	// paused scope (ymirflow pause) is parked until its resume, not run
	// (lockmw.Config.Pauses). Default: nil, no check (and no round trip for it).
	Pauses *lease.Pauses
	// Handler does the stage's work. It finds its lease with lockmw.LeaseFrom.
	// Required.
	Handler message.NoPublishHandlerFunc
}

// Dead is one event the handler gave up on, as RouterConfig.OnDead hears of it.
type Dead struct {
	Msg      *message.Message
	DeadID   string // id in the dead-letter stream
	Attempts int
	Err      error
}

// defaults fills the fields left zero and validates the config; errors name the field.
func (c *RouterConfig) defaults() error {
	var missing []string
	for _, f := range []struct {
		name  string
		unset bool
	}{{"Client", c.Client == nil}, {"ClientOptions", c.ClientOptions == nil}, {"Locker", c.Locker == nil},
		{"Handler", c.Handler == nil}, {"Consumer", c.Consumer == ""}} {
		if f.unset {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("pipeline: RouterConfig.%s required", strings.Join(missing, ", RouterConfig."))
	}
	if err := event.CheckAgent(c.Agent, c.Branch); err != nil {
		return fmt.Errorf("pipeline: RouterConfig.Agent, Branch: %w", err)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.Concurrency < 0 {
		return fmt.Errorf("pipeline: RouterConfig.Concurrency must be positive, got %d", c.Concurrency)
	}
	if c.BlockTime == 0 {
		c.BlockTime = DefaultBlockTime
	}
	if c.MaxIdleTime == 0 {
		c.MaxIdleTime = DefaultMaxIdleTime
	}
	if c.ClaimInterval == 0 {
		c.ClaimInterval = DefaultClaimInterval
	}
	if c.NackResendSleep == 0 {
		c.NackResendSleep = time.Second
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = time.Second
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = c.BlockTime + time.Second + 10*time.Second
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"BlockTime", c.BlockTime}, {"MaxIdleTime", c.MaxIdleTime}, {"ClaimInterval", c.ClaimInterval},
		{"NackResendSleep", c.NackResendSleep}} {
		if d.d < 0 {
			return fmt.Errorf("pipeline: RouterConfig.%s must be positive, got %s", d.name, d.d)
		}
	}
	if c.ReadBatch == 0 {
		c.ReadBatch = DefaultReadBatch
	}
	if c.ReadBatch < 1 || c.ReadBatch > MaxReadBatch {
		return fmt.Errorf("pipeline: RouterConfig.ReadBatch must be between 1 and %d, got %d", MaxReadBatch, c.ReadBatch)
	}
	if c.MaxRetries < 1 {
		return fmt.Errorf("pipeline: RouterConfig.MaxRetries must be at least 1, got %d", c.MaxRetries)
	}
	// A rule for a type no worker runs never applies: refused here, before any
	// subscription opens a connection (the lock middleware checks it too).
	if err := c.Policies.CheckTypes(event.WorkTypes()); err != nil {
		return errors.New("pipeline: RouterConfig.Policies " + strings.TrimPrefix(err.Error(), "lockmw: Config.Policies "))
	}
	return nil
}

// Router is one worker's Watermill router with its subscriptions.
type Router struct {
	*message.Router
	cfg    RouterConfig
	log    zerolog.Logger
	subs   []*subscription
	locks  []*lockmw.Middleware
	drains drainControl // drain.go

	mu      sync.Mutex
	started bool // Run handed over to Watermill's Run
	closed  bool
}

// NewRouter builds the router of (Agent, Branch): for each input stream (the :todo twin
// and the main stream) Concurrency subscriptions, each with the full middleware stack.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	base := cfg.Logger
	if cfg.Branch != "" {
		base = base.With().Str("branch", cfg.Branch).Logger()
	}
	log := base.With().Str("agent", cfg.Agent).Logger()
	wr, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, newWatermillLogger(log))
	if err != nil {
		return nil, err
	}
	r := &Router{Router: wr, cfg: cfg, log: log}
	dead := &deadLetters{rdb: cfg.Client, stream: cfg.Topology.Dead(), maxLen: cfg.MaxLen, agent: cfg.Agent,
		attempts: cfg.MaxRetries, locker: cfg.Locker, log: log, metrics: cfg.Metrics, redactor: cfg.Redactor,
		onDead: cfg.OnDead}
	for _, route := range cfg.Topology.Inputs(cfg.Agent, cfg.Branch) {
		for i := range cfg.Concurrency {
			consumer := cfg.Consumer + "-" + strconv.Itoa(i)
			sub, err := newSubscription(subscriptionConfig{Route: route, Consumer: consumer, ClientOptions: cfg.ClientOptions,
				Shared: cfg.Client, Locker: cfg.Locker, BlockTime: cfg.BlockTime, MaxIdleTime: cfg.MaxIdleTime,
				ClaimInterval: cfg.ClaimInterval, NackSleep: cfg.NackResendSleep, MaxEventBytes: cfg.MaxEventBytes,
				ReadBatch: cfg.ReadBatch, Logger: log, Runnable: event.Runnable(cfg.Agent, cfg.Locker.Canonicalize, cfg.MaxEventBytes)})
			if err != nil {
				return nil, err
			}
			r.subs = append(r.subs, sub)
			var src lockmw.Source = sub
			var runLimit *runLimiter
			if cfg.RunLimit != nil {
				src = unpeeked{sub}
				if runLimit, err = newRunLimiter(cfg.RunLimit, sub, cfg.Client, log); err != nil {
					return nil, err
				}
			}
			lockMW, err := lockmw.NewMiddleware(lockmw.Config{Locker: cfg.Locker, Agent: cfg.Agent, Source: src,
				Policy: cfg.Policy, Policies: cfg.Policies, EventTypes: event.WorkTypes(), Scopes: cfg.Scopes, Limits: cfg.Limits, MailboxDepth: cfg.MailboxDepth, MaxIdleTime: cfg.MaxIdleTime, IssueKey: issueKeyOf,
				OnConflict: conflictRecorder(cfg.Topology.Results(), cfg.MaxLen), Logger: base, Pauses: cfg.Pauses, Branch: cfg.Branch})
			if err != nil {
				return nil, err
			}
			r.locks = append(r.locks, lockMW)
			h := wr.AddConsumerHandler(route.Stream+"#"+strconv.Itoa(i), route.Stream, sub.sub, cfg.Handler)
			stack := []message.HandlerMiddleware{
				middleware.Recoverer,
				correlation,
			}
			if tr := event.Tracer(cfg.TracerProvider); tr != nil {
				stack = append(stack, (&tracing{tracer: tr, rdb: cfg.Client, topo: cfg.Topology, group: route.Group,
					base: traceBase(cfg.Agent, cfg.Branch, consumer), redactor: cfg.Redactor}).middleware)
			}
			if cfg.Metrics != nil {
				stack = append(stack, cfg.Metrics.handlerMiddleware())
			}
			stack = append(stack, dead.middleware(sub))
			if runLimit != nil {
				stack = append(stack, runLimit.middleware)
			}
			stack = append(stack,
				lockMW.Handler,
				newDelivery,
				retry(cfg.MaxRetries, cfg.RetryInitial, log),
			)
			if cfg.HandlerTimeout > 0 {
				stack = append(stack, middleware.Timeout(cfg.HandlerTimeout))
			}
			stack = append(stack, countAttempts)
			h.AddMiddleware(stack...)
		}
	}
	return r, nil
}

// Run prepares the consumer groups, re-marks this worker's own pending entries for
// immediate pickup, and runs until ctx is cancelled; it then stops reading, cancels the
// in-flight handlers (their leases are released and their entries stay pending) and
// returns within 1 s + the handlers' own wind-down (a read in flight is not waited for).
func (r *Router) Run(ctx context.Context) error {
	for _, s := range r.subs {
		n, err := s.prepare(ctx)
		if err != nil {
			return err
		}
		if n > 0 {
			s.log.Info().Int("entries", n).Msg("resuming this consumer's pending entries from its previous run")
		}
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errors.New("pipeline: router closed before it ran")
	}
	r.started = true
	r.mu.Unlock()
	r.pollDrains(ctx) // a worker started while a drain request for it stands starts drained
	go r.trimLoop(ctx)
	pctx, stopPromote := context.WithCancel(ctx)
	promoted := make(chan struct{})
	go func() { defer close(promoted); r.promoteLoop(pctx) }()
	defer func() { stopPromote(); <-promoted }()
	if len(r.locks) > 0 && r.locks[0].Waits() {
		// ON_CONFLICT wait: move lines whose wake-up was lost (lockmw.RunLineWaker).
		waker := make(chan struct{})
		go func() { defer close(waker); r.locks[0].RunLineWaker(pctx, r.cfg.MaxIdleTime) }()
		defer func() { stopPromote(); <-waker }()
	}
	if len(r.locks) > 0 && r.locks[0].LimitsRun() {
		// RUN_LIMITS: hand out slots that freed by themselves (lockmw.RunSlotWaker).
		swaker := make(chan struct{})
		go func() { defer close(swaker); r.locks[0].RunSlotWaker(pctx, slotWakeEvery(r.cfg.MaxIdleTime)) }()
		defer func() { stopPromote(); <-swaker }()
	}
	defer r.startPresence(ctx)() // presence.go: the console's alive / dead
	// A force release stops its holder here at once, not at the holder's next heartbeat.
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if err := r.cfg.Locker.WatchEvictions(wctx); err != nil {
			r.log.Warn().Err(err).Msg("not watching force releases; an evicted holder stops at its next heartbeat")
		}
	}()
	defer func() { stopWatch(); <-watched }()
	err := r.runWatermill(ctx)
	// A lease taken ahead for an entry that was never handed over goes back now, so
	// the entry's issue is free for whoever resumes it.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range r.locks {
		l.Close(cctx)
	}
	for _, s := range r.subs {
		s.stopOffers()
		// Watermill closes its subscribers only when the router is closed, not when
		// Run's context ends: without this, each subscription's own Redis client (and
		// its read loop) would outlive the router. close is idempotent.
		if cerr := s.close(); cerr != nil {
			r.log.Warn().Err(cerr).Str("stream", s.route.Stream).Msg("closing a subscription")
		}
	}
	return err
}

// runWatermill runs Watermill's router until ctx ends. Watermill's start-up pass does
// not see ctx: a Subscribe under an ended context fails (its consumer group is created
// with that context), and Watermill, which counts a handler as running from the moment
// it is added, would then wait CloseTimeout in Close for handlers that never started
// and leave goroutines behind. So Watermill runs on a context of its own, and the end
// of ctx closes it once it runs, which cancels the handlers' contexts as before.
func (r *Router) runWatermill(ctx context.Context) error {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	returned := make(chan struct{})
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		select {
		case <-ctx.Done():
		case <-returned:
			return
		}
		select {
		case <-r.Router.Running():
			if err := r.Router.Close(); err != nil {
				r.log.Warn().Err(err).Msg("closing the router")
			}
		case <-returned:
		}
	}()
	err := r.Router.Run(wctx)
	close(returned)
	<-closed
	if err != nil {
		// Its handlers never all started: Close must not wait for them.
		r.mu.Lock()
		r.started = false
		r.mu.Unlock()
	}
	return err
}

// Close stops the router. Watermill counts a handler as running from the moment it is
// added, so on a router whose Run never reached Watermill's (cancelled during the
// start-up pass, or never called) its Close would wait CloseTimeout for handlers that
// never started; such a router just closes its subscriptions.
func (r *Router) Close() error {
	r.mu.Lock()
	started := r.started
	r.closed = true
	r.mu.Unlock()
	if started {
		return r.Router.Close()
	}
	var errs []error
	for _, s := range r.subs {
		errs = append(errs, s.close())
	}
	return errors.Join(errs...)
}

// trimLoop keeps the router's input streams near MaxLen with Trim, which spares every
// entry a group still needs.
func (r *Router) trimLoop(ctx context.Context) {
	if r.cfg.MaxLen <= 0 {
		return
	}
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, route := range r.cfg.Topology.Inputs(r.cfg.Agent, r.cfg.Branch) {
			if n, err := event.Trim(ctx, r.cfg.Client, route.Stream, r.cfg.MaxLen); err != nil {
				r.cfg.Logger.Warn().Err(err).Str("stream", route.Stream).Msg("trim failed")
			} else if n > 0 {
				r.cfg.Logger.Debug().Int64("removed", n).Str("stream", route.Stream).Msg("trimmed")
			}
		}
	}
}

// promoteLoop appends the due delayed events (policy delay, the run limit) of the router's input
// streams to them again, until ctx ends. Every worker of a stream runs it; the promote
// script moves each event once whoever runs it, and a restarted or replaced worker
// picks up what a gone one delayed. It waits for the next due event, at most
// promotePoll (events delayed meanwhile by another worker), never spinning.
func (r *Router) promoteLoop(ctx context.Context) {
	if !r.cfg.Policies.Uses(lockmw.Delay) && r.cfg.RunLimit == nil {
		return
	}
	var streams []string
	for _, route := range r.cfg.Topology.Inputs(r.cfg.Agent, r.cfg.Branch) {
		streams = append(streams, route.Stream)
	}
	wait := time.Duration(0)
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = promotePoll
		for _, s := range streams {
			n, next, err := delayq.Promote(ctx, r.cfg.Client, s)
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn().Err(err).Str("stream", s).Msg("promoting delayed events failed; retrying")
				}
				continue
			}
			if n > 0 {
				r.log.Debug().Int("events", n).Str("stream", s).Msg("delayed events due: appended to their stream again")
			}
			if n == delayq.PromoteBatch {
				wait = 0 // more are due
			} else if !next.IsZero() {
				wait = min(wait, max(time.Until(next), time.Millisecond))
			}
		}
	}
}

// promotePoll bounds how long the promoter waits: an event another worker delays is
// promoted at most this late.
const promotePoll = time.Second

// Healthy reports whether the router runs and every subscription still reads.
func (r *Router) Healthy() bool { return r.IsRunning() && !r.IsClosed() }

// slotWakeEvery is how often the slot waker sweeps: a dead run's slot frees at its
// lease's expiry, which the sweep turns into a hand-over; at most every 5 s, so the
// metrics of the limit keys stay fresh.
func slotWakeEvery(maxIdle time.Duration) time.Duration {
	return max(min(maxIdle, 5*time.Second), 100*time.Millisecond)
}
