// Package pipelinetest tests Watermill handlers the way a ymirflow worker runs them: under
// the real per-issue lease, through a real router reading real consumer groups on a real
// Redis. It is in the spirit of River's rivertest, for users of package pipeline who
// write their own handlers, and it is what ymirflow's own tests use.
//
// New gives a test its own namespace on the test Redis (REDIS_URL, default
// redis://127.0.0.1:6379/15: keep test keys out of DB 0); every key the test makes starts
// with it and is deleted when the test ends, and only those. Config is a router with
// settings fast enough for tests, StartTriage and Start run one and return once it reads,
// and the test's end closes it. PublishTriage, Entries, Records, Pending and Dead read and
// write the streams as a worker and an operator see them.
//
// It never mocks Redis. What a test sees is what a worker does: a second event for an
// issue whose lease is held is dropped, a lost lease cancels the handler, a failed
// handler is retried inside the lease and then dead-lettered.
//
// An Env leaves nothing behind: when the test ends its routers are closed (with their
// subscriptions' Redis clients), its shared client is closed and its keys are deleted,
// so no connection or goroutine outlives the test (TestEnvLeavesNoConnectionOrGoroutine).
package pipelinetest

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// StartTimeout bounds how long Start waits for a router to read; generous, because CI
// is a busy machine.
const StartTimeout = 10 * time.Second

// Env is one test's pipeline world on the shared test Redis. Every key it makes starts
// with Namespace and is deleted when the test ends.
type Env struct {
	tb testing.TB
	// Client is shared by leases, results and dead letters (and the test's own reads).
	Client *redis.Client
	// Options open each subscriber's own client (a subscriber closes its client).
	Options *redis.UniversalOptions
	// Namespace is the test's key prefix, e.g. "t-3f9a1c2b:".
	Namespace string
	// Topology puts the pipeline's streams under Namespace + "ymir".
	Topology event.Topology
	// Publisher appends events to the env's streams.
	Publisher *event.Publisher
}

// New returns a fresh Env; it fails the test with a line saying how to start Redis when
// none answers.
func New(tb testing.TB) *Env {
	tb.Helper()
	rdb, ns := redistest.Client(tb)
	opts, err := pipeline.ClientOptions(redistest.URL())
	if err != nil {
		tb.Fatal(err)
	}
	return &Env{tb: tb, Client: rdb, Options: opts, Namespace: ns,
		Topology: event.Topology{Namespace: ns + "ymir"}, Publisher: event.NewPublisher(rdb, 0)}
}

// OnServer returns an Env on a server the test manages itself (a private redis-server it
// stops, restarts, pauses or cuts under a running router): rdb is the test's client on it,
// which the Env shares and does not close, and rawURL opens each subscriber's own client.
// The keys are not deleted: a private server goes with its test.
func OnServer(tb testing.TB, rdb *redis.Client, rawURL string) *Env {
	tb.Helper()
	opts, err := pipeline.ClientOptions(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	ns := redistest.Namespace()
	return &Env{tb: tb, Client: rdb, Options: opts, Namespace: ns,
		Topology: event.Topology{Namespace: ns + "ymir"}, Publisher: event.NewPublisher(rdb, 0)}
}

// OnURL returns an Env whose clients (shared and subscribers') connect to rawURL with
// the pipeline's own client settings (pipeline.ClientOptions: go-redis's retries
// included), on a fresh namespace deleted when the test ends. Tests that put a fault
// between the pipeline and Redis (redistest.LossyProxy) point it at the fault.
func OnURL(tb testing.TB, rawURL string) *Env {
	tb.Helper()
	opts, err := pipeline.ClientOptions(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	rdb, ns := redis.NewClient(opts.Simple()), redistest.Namespace()
	tb.Cleanup(func() {
		redistest.DeleteNamespace(context.Background(), rdb, ns)
		_ = rdb.Close()
	})
	return &Env{tb: tb, Client: rdb, Options: opts, Namespace: ns,
		Topology: event.Topology{Namespace: ns + "ymir"}, Publisher: event.NewPublisher(rdb, 0)}
}

// Locker returns a lease manager on the env's client with o's options; an empty Scope
// becomes the topology's lock scope, so the leases live in the test's namespace.
func (e *Env) Locker(o lease.Options) *lease.Locker {
	e.tb.Helper()
	if o.Scope == "" {
		o.Scope = e.Topology.LockScope()
	}
	l, err := lease.New(e.Client, o)
	if err != nil {
		e.tb.Fatal(err)
	}
	return l
}

// Config is a router for (agent, branch) on the env with settings fast enough for tests:
// XREADGROUP blocks 100 ms, claim passes every 100 ms, entries may be claimed after 2 s
// idle, two attempts 10 ms apart, a nacked message comes back after 50 ms. Change any
// field before Start.
func (e *Env) Config(agent, branch, consumer string, locker *lease.Locker, h message.NoPublishHandlerFunc) pipeline.RouterConfig {
	return pipeline.RouterConfig{
		Client: e.Client, ClientOptions: e.Options, Topology: e.Topology, Agent: agent, Branch: branch,
		Consumer: consumer, BlockTime: 100 * time.Millisecond, MaxIdleTime: 2 * time.Second,
		ClaimInterval: 100 * time.Millisecond, NackResendSleep: 50 * time.Millisecond, MaxRetries: 2,
		RetryInitial: 10 * time.Millisecond, CloseTimeout: 5 * time.Second, Locker: locker, Handler: h,
	}
}

// Start builds the router of cfg and runs it until ctx ends or the test ends, and
// returns once it reads; the channel receives Run's result. A router that cannot be
// built, or stops or hangs at start, fails the test.
func Start(ctx context.Context, tb testing.TB, cfg pipeline.RouterConfig) (*pipeline.Router, <-chan error) {
	tb.Helper()
	r, err := pipeline.NewRouter(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t := time.NewTimer(StartTimeout)
	defer t.Stop()
	select {
	case <-r.Running():
	case err := <-done:
		tb.Fatalf("router %s stopped at start: %v", cfg.Consumer, err)
	case <-t.C:
		tb.Fatalf("router %s did not start within %s", cfg.Consumer, StartTimeout)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r, done
}

// TriageOptions are the knobs a test turns on a triage router (StartTriage); the rest are
// Config's fast defaults, with XREADGROUP blocking 200 ms.
type TriageOptions struct {
	Consumer string        // "w1" when empty
	TTL      time.Duration // of the lease; 3 s when zero
	MaxIdle  time.Duration // MAX_IDLE_TIME; Config's when zero
	Policy   lockmw.Policy
	// MailboxDepth bounds each lease's mailbox (Policy lockmw.Deliver); the
	// default's when zero.
	MailboxDepth int64
	MaxRetries   int // Config's when zero
	Concurrency  int
	Logger       zerolog.Logger
}

// TriageLocker is a lease manager with the given TTL whose leases live in the env's
// namespace.
func (e *Env) TriageLocker(ttl time.Duration) *lease.Locker {
	return e.Locker(lease.Options{Scope: e.Namespace, TTL: ttl})
}

// StartTriage starts a triage router with o's settings and handler h (see Start).
func (e *Env) StartTriage(ctx context.Context, o TriageOptions, h message.NoPublishHandlerFunc) (*pipeline.Router, <-chan error) {
	e.tb.Helper()
	if o.TTL == 0 {
		o.TTL = 3 * time.Second
	}
	if o.Consumer == "" {
		o.Consumer = "w1"
	}
	cfg := e.Config("triage", "", o.Consumer, e.TriageLocker(o.TTL), h)
	cfg.BlockTime, cfg.Concurrency, cfg.Policy, cfg.Logger = 200*time.Millisecond, o.Concurrency, o.Policy, o.Logger
	cfg.MailboxDepth = o.MailboxDepth
	if o.MaxIdle != 0 {
		cfg.MaxIdleTime = o.MaxIdle
	}
	if o.MaxRetries != 0 {
		cfg.MaxRetries = o.MaxRetries
	}
	return e.Start(ctx, cfg)
}

// Start is Start on the env's test.
func (e *Env) Start(ctx context.Context, cfg pipeline.RouterConfig) (*pipeline.Router, <-chan error) {
	e.tb.Helper()
	return Start(ctx, e.tb, cfg)
}

// Entries returns every entry of stream (e.g. Topology.Results() or Topology.Dead()),
// oldest first.
func (e *Env) Entries(stream string) []redis.XMessage {
	e.tb.Helper()
	all, err := e.Client.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		e.tb.Fatal(err)
	}
	return all
}

// TriageStream is the env's triage stream (not the :todo twin), where PublishTriage
// writes.
func (e *Env) TriageStream() string { return e.Topology.Stream("triage", "", false) }

// Dead returns every entry of the dead-letter stream, oldest first.
func (e *Env) Dead() []redis.XMessage {
	e.tb.Helper()
	return e.Entries(e.Topology.Dead())
}

// Pending is the number of entries of stream delivered to group and not acked; 0 when
// the group or the stream does not exist yet.
func (e *Env) Pending(stream, group string) int64 {
	e.tb.Helper()
	p, err := e.Client.XPending(context.Background(), stream, group).Result()
	if err != nil {
		if redis.HasErrorPrefix(err, "NOGROUP") {
			return 0
		}
		e.tb.Fatal(err)
	}
	return p.Count
}

// PublishTriage appends a minimal triage request for key ({"metadata":{"issue":KEY}}, as
// `ymirflow enqueue` writes it) to the triage stream and returns its entry id.
func (e *Env) PublishTriage(key string) string {
	e.tb.Helper()
	task, err := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	if err != nil {
		e.tb.Fatal(err)
	}
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		e.tb.Fatal(err)
	}
	id, err := e.Publisher.PublishID(context.Background(), e.TriageStream(), msg)
	if err != nil {
		e.tb.Fatal(err)
	}
	return id
}

// Records returns the entries of the results stream whose event_type is eventType
// (event.StageDone, event.LockDropped, ...), oldest first.
func (e *Env) Records(eventType string) []redis.XMessage {
	e.tb.Helper()
	var out []redis.XMessage
	for _, m := range e.Entries(e.Topology.Results()) {
		if m.Values["event_type"] == eventType {
			out = append(out, m)
		}
	}
	return out
}

// Runs counts handler runs per issue key; handlers on several subscriptions may add at
// once. The zero value is ready to use.
type Runs struct {
	mu sync.Mutex
	n  map[string]int
}

// Add records one more run of key and returns how many there have been.
func (r *Runs) Add(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[key]++
	return r.n[key]
}

// Get returns how many runs of key were recorded.
func (r *Runs) Get(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

// Snapshot returns a copy of the counts, for failure messages.
func (r *Runs) Snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.n)
}
