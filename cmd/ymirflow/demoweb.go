package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/web"
)

// demoConsole is `ymirflow demo --web`: the console listens before the demo starts
// (a bad address fails at once) and serves the demo's streams once its Redis is up.
type demoConsole struct {
	ln    net.Listener
	hs    *http.Server
	log   zerolog.Logger
	token string

	mu  sync.Mutex
	srv *web.Server
	rdb redis.UniversalClient
}

func startDemoConsole(addr string, log zerolog.Logger) (*demoConsole, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, usageError{listenError("DEMO_WEB", "web", addr, err)}
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	c := &demoConsole{ln: ln, log: log, token: hex.EncodeToString(b)}
	c.hs = httpsrv.New(c, httpsrv.Limits{})
	go func() { _ = c.hs.Serve(ln) }()
	return c, nil
}

// URL is where the console serves.
func (c *demoConsole) URL() string { return "http://" + c.ln.Addr().String() + "/" }

func (c *demoConsole) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	srv := c.srv
	c.mu.Unlock()
	if srv == nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the demo is starting; reload in a moment", http.StatusServiceUnavailable)
		return
	}
	srv.ServeHTTP(w, r)
}

// attach points the console at the demo's Redis and namespace.
func (c *demoConsole) attach(ctx context.Context, redisURL, namespace string) error {
	rdb, err := pipeline.Connect(ctx, redisURL)
	if err != nil {
		return err
	}
	topo := event.Topology{Namespace: namespace}
	locker, err := lease.New(rdb, lease.Options{Scope: topo.LockScope(), Logger: c.log})
	if err != nil {
		_ = rdb.Close()
		return err
	}
	in, err := inspect.New(inspect.Config{Client: rdb, Topology: topo, Locker: locker})
	if err != nil {
		_ = rdb.Close()
		return err
	}
	srv, err := web.New(web.Config{Inspector: in, Topology: topo, Token: c.token, TokenHint: config.WebTokenHint, Redactor: redact.New(), Logger: c.log})
	if err != nil {
		_ = rdb.Close()
		return err
	}
	c.mu.Lock()
	c.srv, c.rdb = srv, rdb
	c.mu.Unlock()
	return nil
}

func (c *demoConsole) intro(w io.Writer) {
	fmt.Fprintf(w, "Console: %s (sign in with token %s to requeue, purge or release)\n", c.URL(), c.token)
}

func (c *demoConsole) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = c.hs.Shutdown(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rdb != nil {
		_ = c.rdb.Close()
	}
}
