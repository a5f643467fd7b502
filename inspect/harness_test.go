package inspect_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline"
)

// env is one test's pipeline: its own namespace for streams and leases on the shared
// test Redis.
type env struct {
	t    testing.TB
	rdb  *redis.Client
	ns   string
	topo pipeline.Topology
	pub  *pipeline.Publisher
	opts *redis.UniversalOptions
}

func newEnv(t testing.TB) *env {
	rdb, ns := redistest.Client(t)
	opts, err := pipeline.ClientOptions(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, rdb: rdb, ns: ns, topo: pipeline.Topology{Namespace: ns + "ymir"}, pub: pipeline.NewPublisher(rdb, 0), opts: opts}
}

func (e *env) locker(ttl time.Duration) *lockmw.Locker {
	l, err := lockmw.New(e.rdb, lockmw.Options{Scope: e.ns, TTL: ttl})
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

// routerOpts are the knobs tests turn; the rest are fast defaults.
type routerOpts struct {
	consumer    string
	ttl         time.Duration
	maxIdle     time.Duration
	policy      lockmw.Policy
	maxRetries  int
	concurrency int
	logger      zerolog.Logger
}

func (e *env) start(ctx context.Context, o routerOpts, h message.NoPublishHandlerFunc) (*pipeline.Router, <-chan error) {
	e.t.Helper()
	if o.ttl == 0 {
		o.ttl = 3 * time.Second
	}
	if o.maxIdle == 0 {
		o.maxIdle = 2 * time.Second
	}
	if o.consumer == "" {
		o.consumer = "w1"
	}
	if o.maxRetries == 0 {
		o.maxRetries = 2
	}
	r, err := pipeline.NewRouter(pipeline.RouterConfig{
		Client: e.rdb, ClientOptions: e.opts, Topology: e.topo, Agent: "triage", Consumer: o.consumer,
		Concurrency: o.concurrency,
		BlockTime:   200 * time.Millisecond, MaxIdleTime: o.maxIdle, ClaimInterval: 100 * time.Millisecond,
		NackResendSleep: 50 * time.Millisecond, MaxRetries: o.maxRetries, RetryInitial: 10 * time.Millisecond,
		CloseTimeout: 5 * time.Second, Policy: o.policy, Locker: e.locker(o.ttl), Logger: o.logger, Handler: h,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Running():
	case err := <-done:
		e.t.Fatalf("router stopped at start: %v", err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("router did not start")
	}
	e.t.Cleanup(func() { r.Close() })
	return r, done
}

func (e *env) triage() string { return e.topo.Stream("triage", "", false) }

func (e *env) publishTriage(key string) string {
	e.t.Helper()
	task, _ := pipeline.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	msg, err := pipeline.NewEvent(pipeline.EventTriageRequested, key, task, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	id, err := e.pub.PublishID(context.Background(), e.triage(), msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *env) results(eventType string) []redis.XMessage {
	e.t.Helper()
	all, err := e.rdb.XRange(context.Background(), e.topo.Results(), "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var out []redis.XMessage
	for _, m := range all {
		if m.Values["event_type"] == eventType {
			out = append(out, m)
		}
	}
	return out
}

func (e *env) dead() []redis.XMessage {
	all, err := e.rdb.XRange(context.Background(), e.topo.Dead(), "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return all
}

func (e *env) pending(stream string) int64 {
	p, err := e.rdb.XPending(context.Background(), stream, "triage").Result()
	if err != nil {
		if strings.Contains(err.Error(), "NOGROUP") {
			return 0
		}
		e.t.Fatal(err)
	}
	return p.Count
}

// runs counts handler runs per issue key.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) add(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[key]++
	return r.n[key]
}

func (r *runs) get(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[key]
}

func issueOf(msg *message.Message) string { return msg.Metadata.Get(pipeline.MetaIssueKey) }

var errBoom = errors.New("boom")
