package web_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/web"
)

// A secret the process knows (like the Redis password): it must never be shown.
const secret = "hunter2-redis-password"

const token = "console-token-0123456789"

// env is one test's pipeline and console on the shared test Redis.
type env struct {
	t      testing.TB
	rdb    *redis.Client
	ns     string
	topo   event.Topology
	pub    *event.Publisher
	locker *lease.Locker
	in     *inspect.Inspector
	srv    *web.Server
	ts     *httptest.Server
	deadID string // the dead letter a write case acts on
}

func newEnv(t testing.TB, tok string) *env { t.Helper(); return newEnvWith(t, web.Config{Token: tok}) }

// newEnvWith is newEnv with the console's operators and proxy settings of cfg.
func newEnvWith(t testing.TB, cfg web.Config) *env {
	t.Helper()
	rdb, ns := redistest.Client(t)
	e := &env{t: t, rdb: rdb, ns: ns, topo: event.Topology{Namespace: ns + "ymir"}, pub: event.NewPublisher(rdb, 0)}
	var err error
	if e.locker, err = lease.New(rdb, lease.Options{Scope: e.topo.LockScope(), TTL: 9 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if e.in, err = inspect.New(inspect.Config{Client: rdb, Topology: e.topo, Locker: e.locker}); err != nil {
		t.Fatal(err)
	}
	cfg.Inspector, cfg.Topology, cfg.Redactor, cfg.Refresh = e.in, e.topo, redact.New(secret), 500*time.Millisecond
	if e.srv, err = web.New(cfg); err != nil {
		t.Fatal(err)
	}
	e.ts = httptest.NewServer(e.srv)
	t.Cleanup(e.ts.Close)
	return e
}

// publish puts a triage request for key on the triage stream.
func (e *env) publish(key string) string {
	e.t.Helper()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	id, err := e.pub.PublishID(context.Background(), e.topo.Stream("triage", "", false), msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// bury writes a dead letter of a triage request for key with error reason.
func (e *env) bury(key, reason string) string {
	e.t.Helper()
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	v := event.Encode(msg)
	v[event.DeadFieldStream], v[event.DeadFieldID], v[event.DeadFieldError] = e.topo.Stream("triage", "", false), "1-0", reason
	v[event.DeadFieldAttempts], v[event.DeadFieldAgent], v[event.DeadFieldAt] = "3", "triage", time.Now().UTC().Format(time.RFC3339Nano)
	id, err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.topo.Dead(), Values: v}).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// start runs a triage router whose handler is h.
func (e *env) start(ctx context.Context, h message.NoPublishHandlerFunc) {
	e.t.Helper()
	opts, err := pipeline.ClientOptions(redistest.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := pipeline.NewRouter(pipeline.RouterConfig{
		Client: e.rdb, ClientOptions: opts, Topology: e.topo, Agent: "triage", Consumer: "w1", Concurrency: 2,
		BlockTime: 200 * time.Millisecond, MaxIdleTime: 4 * time.Second, ClaimInterval: 100 * time.Millisecond,
		NackResendSleep: 50 * time.Millisecond, MaxRetries: 1, RetryInitial: 10 * time.Millisecond,
		CloseTimeout: 5 * time.Second, Locker: e.locker, Handler: h,
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
}

// do sends a request to the console and returns status and body.
func (e *env) do(method, path, body string, hdr map[string]string) (int, string, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.ts.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, sb.String(), resp.Header
}

func (e *env) get(path string) (int, string) {
	code, body, _ := e.do("GET", path, "", nil)
	return code, body
}
