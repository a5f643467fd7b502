package pipeline_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

func TestClientOptionsFromURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url     string
		addrs   []string
		user    string
		pass    string
		db      int
		tls     bool
		cluster bool
	}{
		{"redis://127.0.0.1:6379/0", []string{"127.0.0.1:6379"}, "", "", 0, false, false},
		{"redis://:secret@h:6380/3", []string{"h:6380"}, "", "secret", 3, false, false},
		{"rediss://ymir:pw@redis.example:6380/1", []string{"redis.example:6380"}, "ymir", "pw", 1, true, false},
		{"redis://a:7000,b:7001,c:7002", []string{"a:7000", "b:7001", "c:7002"}, "", "", 0, false, true},
	}
	for _, c := range cases {
		o, err := pipeline.ClientOptions(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if strings.Join(o.Addrs, ",") != strings.Join(c.addrs, ",") || o.Username != c.user || o.Password != c.pass ||
			o.DB != c.db || (o.TLSConfig != nil) != c.tls || o.IsClusterMode != c.cluster {
			t.Errorf("%s: got %+v", c.url, o)
		}
	}
	for _, bad := range []string{"", "http://x:1", "redis://h/notanumber"} {
		if _, err := pipeline.ClientOptions(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestConnectUnreachableNamesURLWithoutPassword(t *testing.T) {
	t.Parallel()
	port := redistest.FreePort(t)
	url := "redis://ymir:hunter2@127.0.0.1:" + itoa(port) + "/0"
	_, err := pipeline.Connect(context.Background(), url)
	if !errors.Is(err, pipeline.ErrRedisUnreachable) {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "127.0.0.1:"+itoa(port)) {
		t.Fatalf("error must name the URL without the password: %v", err)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := pipeline.NewMetrics(nil)
	ready := false
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := pipeline.Health{Metrics: m, Redis: e.rdb, Ready: func() bool { return ready }}.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("/readyz before the router runs = %d", code)
	}
	ready = true
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d", code)
	}
	m.Acquired("triage")
	m.Busy("triage")
	m.Conflict("triage", "dropped", "locked")
	m.Lost("triage", lease.ErrLeaseUnproven)
	m.Released("triage", time.Second)
	_, body := get("/metrics")
	for _, want := range []string{`ymirflow_lease_acquired_total{agent="triage"} 1`, `ymirflow_lease_busy_total{agent="triage"} 1`,
		`ymirflow_lease_lost_total{agent="triage",cause="unproven"} 1`, `ymirflow_lease_hold_seconds_count{agent="triage"} 1`,
		`ymirflow_lock_conflicts_total{agent="triage",outcome="dropped",reason="locked"} 1`} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

// Redis restarting mid-run (AOF on): no crash, no lost event.
func TestRedisRestartMidRunLosesNothing(t *testing.T) {
	// Not parallel: it restarts its own redis-server under a running router, within time bounds.
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	e := newEnvOn(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var r runs
	_, done := e.start(ctx, routerOpts{}, func(msg *message.Message) error { r.Add(issueOf(msg)); return nil })
	keys := []string{}
	for i := 1; i <= 20; i++ {
		k := "RHEL-" + itoa(i)
		keys = append(keys, k)
		if i == 10 {
			srv.Restart()
		}
		// The publisher side of the test retries too, until the restarted server answers.
		redistest.Eventually(t, 30*time.Second, func() bool {
			_, err := e.pub.PublishID(ctx, e.triage(), mustEvent(t, k))
			return err == nil
		}, "publish %s after the restart", k)
	}
	redistest.Eventually(t, 30*time.Second, func() bool {
		for _, k := range keys {
			if r.Get(k) == 0 {
				return false
			}
		}
		return e.pendingOn(srv.Client()) == 0
	}, "every event handled after the restart")
	select {
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	default:
	}
}

func mustEvent(t *testing.T, key string) *message.Message {
	task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
	msg, err := event.New(event.TriageRequested, key, task, nil)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func (e *env) pendingOn(c *redis.Client) int64 {
	p, err := c.XPending(context.Background(), e.triage(), "triage").Result()
	if err != nil {
		return -1
	}
	return p.Count
}

func itoa(i int) string { return strconv.Itoa(i) }

// A router whose Run ended before Watermill's started (its context was cancelled during
// the start-up pass) closes at once, not after CloseTimeout: a SIGTERM during start-up,
// or the demo interrupted early, must not wait for handlers that never ran.
func TestCloseOfRouterCancelledAtStartIsImmediate(t *testing.T) {
	// Not parallel: it bounds how long Close takes (a latency).
	e := newEnv(t)
	cfg := e.Config("triage", "", "w1", e.locker(3*time.Second), func(*message.Message) error { return nil })
	cfg.CloseTimeout = 30 * time.Second
	r, err := pipeline.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err == nil {
		t.Fatal("Run with a cancelled context returned nil")
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close took %s (CloseTimeout %s): it waited for handlers that never ran", took, cfg.CloseTimeout)
	}
	// Closed before it ran: Run refuses to start.
	r2, err := pipeline.NewRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(); err != nil {
		t.Errorf("Close before Run: %v", err)
	}
	if err := r2.Run(context.Background()); err == nil {
		t.Error("Run after Close returned nil")
	}
}
