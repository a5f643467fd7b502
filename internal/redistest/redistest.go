// Package redistest gives tests a real Redis: a namespaced client on the shared server
// (REDIS_URL, default redis://127.0.0.1:6379/15) and private redis-server processes for
// tests that must stop, restart or cut the server.
//
// Tests never mock Redis. A test that needs Redis and cannot reach it fails with a line
// saying how to start one; it never skips. A package whose tests or examples use the shared
// server calls Main from its TestMain, so that with Redis down the whole package fails at
// once with one line instead of every test and example failing (or hanging) on its own.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is the server tests use when REDIS_URL is unset. DB 15 keeps test keys away
// from a developer's data in DB 0.
const DefaultURL = "redis://127.0.0.1:6379/15"

// givenURL is REDIS_URL as the test binary was started with it. Tests of the commands
// blank every setting (t.Setenv(name, "")) so nothing leaks in from the caller, REDIS_URL
// among them; URL must still name the server the run was given, never fall back to
// DefaultURL's server behind the user's back.
var givenURL = os.Getenv("REDIS_URL")

// URL returns the Redis URL tests use: REDIS_URL as set now, else as the test binary
// was started with, else DefaultURL.
func URL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	if givenURL != "" {
		return givenURL
	}
	return DefaultURL
}

// Main is the TestMain of a package whose tests or examples use the shared server: one
// PING (no retries, a short dial timeout), then the package's tests. When the server does
// not answer, nothing runs: it prints one line naming the URL tried and how to start a
// server, and exits 1 within seconds. Without it each test would pay go-redis's dial
// retries (≈1.7 s), log them, and an example waiting on a router would block until the
// go test timeout. When Redis is up the cost is one round trip per package, none per test.
func Main(m *testing.M) {
	if err := Reachable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// Reachable pings the shared test server once and returns nil, or an error whose text is
// the one line Main prints: the URL tried (password redacted), why, and how to start one.
func Reachable() error {
	opts, err := redis.ParseURL(URL())
	if err != nil {
		return fmt.Errorf("redistest: REDIS_URL %q is not a Redis URL (%w); unset it to use %s", redactURL(URL()), err, DefaultURL)
	}
	// A plain TCP dial first: go-redis's pool retries a refused dial five times and logs
	// the failure on its own line, which is noise next to the one line that matters.
	conn, err := net.DialTimeout("tcp", opts.Addr, 2*time.Second)
	if err != nil {
		return fmt.Errorf("redistest: cannot reach Redis at %s (%w); %s", redactURL(URL()), err, StartHint(opts.Addr))
	}
	_ = conn.Close()
	opts.DisableIdentity = true
	// One attempt, quickly (TLS, AUTH and SELECT still go through go-redis). The
	// pipeline's own clients retry; a test pre-flight must not.
	opts.MaxRetries = -1
	opts.DialTimeout = 2 * time.Second
	opts.ReadTimeout = 2 * time.Second
	opts.PoolSize = 1
	c := redis.NewClient(opts)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redistest: cannot reach Redis at %s (%w); %s", redactURL(URL()), err, StartHint(opts.Addr))
	}
	return nil
}

// StartHint says how to start a server the tests can use at addr (host:port), naming that
// port: `make redis` starts one on 127.0.0.1:6379 only.
func StartHint(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, "6379"
	}
	local := host == "127.0.0.1" || host == "localhost" || host == "::1" || host == ""
	switch {
	case local && port == "6379":
		return "start one with `make redis` (or `redis-server --daemonize yes --save ''`), or set REDIS_URL to a server that answers"
	case local:
		return "start one with `redis-server --daemonize yes --save '' --port " + port +
			"`, or unset REDIS_URL and run `make redis` (127.0.0.1:6379)"
	default:
		return "check that " + addr + " is up and reachable, or unset REDIS_URL and run `make redis` (127.0.0.1:6379)"
	}
}

// redactURL hides a password in u, which error messages and logs must never show.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "<unparseable URL>"
	}
	return p.Redacted()
}

// Client returns a client on the shared test server and a namespace unique to this test
// (e.g. "t-3f9a1c2b:"). Every key the test creates must start with the namespace; the
// keys are deleted when the test ends, and only those.
func Client(tb testing.TB) (*redis.Client, string) {
	tb.Helper()
	opts, err := redis.ParseURL(URL())
	if err != nil {
		tb.Fatalf("redistest: REDIS_URL %q: %v", redactURL(URL()), err)
	}
	opts.DisableIdentity = true
	c := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		tb.Fatalf("redistest: cannot reach Redis at %s (%v); %s", redactURL(URL()), err, StartHint(opts.Addr))
	}
	ns := Namespace()
	tb.Cleanup(func() {
		DeleteNamespace(context.Background(), c, ns)
		_ = c.Close()
	})
	return c, ns
}

// Namespace returns a fresh random key prefix ending in ':'.
func Namespace() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:]) + ":"
}

// DeleteNamespace deletes every key that contains ns. Keys are matched anywhere, not only
// as a prefix, because some key formats put the namespace inside a hash tag or after an
// agent prefix (lock:<ns>...).
func DeleteNamespace(ctx context.Context, c redis.UniversalClient, ns string) {
	iter := c.Scan(ctx, 0, "*"+ns+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		c.Del(ctx, keys[:n]...)
		keys = keys[n:]
	}
}

// Server is a private redis-server process on a free loopback port in a temp dir.
type Server struct {
	tb      testing.TB
	dir     string
	port    int
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited (and been waited for)
	started bool          // once started, a restart keeps the port
}

// ServerOptions tunes a private server.
type ServerOptions struct {
	AOF  bool     // appendonly yes, appendfsync always: survives restarts
	Args []string // extra redis-server arguments
}

// StartServer starts redis-server on a free port; it is stopped when the test ends.
func StartServer(tb testing.TB, o ServerOptions) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: redis-server not found on PATH; install it with `apt-get install -y redis-server`")
	}
	s := &Server{tb: tb, dir: tb.TempDir(), port: FreePort(tb)}
	s.args = []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--protected-mode", "no"}
	if o.AOF {
		s.args = append(s.args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		s.args = append(s.args, "--appendonly", "no")
	}
	s.args = append(s.args, o.Args...)
	_ = bin
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// URL is a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a new client for the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DisableIdentity: true})
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Start (re)starts the process and waits until it answers PING. On the first start, a
// port taken between FreePort and the server's bind (an outgoing connection's ephemeral
// port, another test's server) makes the server exit: it starts again on another port.
// A restart keeps its port (clients reconnect to it).
func (s *Server) Start() {
	s.tb.Helper()
	first := !s.started
	for try := 0; ; try++ {
		err := s.start()
		if err == nil {
			s.started = true
			return
		}
		if !first || try == 4 {
			s.tb.Fatalf("redistest: %v", err)
		}
		s.tb.Logf("redistest: %v; trying another port", err)
		s.port = FreePort(s.tb)
		s.args[1] = strconv.Itoa(s.port) // s.args begins "--port", port
	}
}

// start runs the process and waits until it answers PING; an error says why not (the
// process exited first, or did not answer within 10 s), with its log's tail.
func (s *Server) start() error {
	s.cmd = exec.Command("redis-server", s.args...)
	s.cmd.Dir = s.dir
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err == nil {
		defer func() { _ = logf.Close() }()
		s.cmd.Stdout, s.cmd.Stderr = logf, logf
	}
	if err := s.cmd.Start(); err != nil {
		s.tb.Fatalf("redistest: start redis-server: %v", err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(s.cmd, s.exited)
	tail := func() string {
		b, _ := os.ReadFile(logPath)
		if len(b) > 600 {
			b = b[len(b)-600:]
		}
		return string(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited before it answered:\n%s", s.Addr(), tail())
		default:
		}
		if pong(s.Addr()) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return fmt.Errorf("redis-server on %s did not answer within 10s:\n%s", s.Addr(), tail())
}

// pong reports whether addr answers PING.
func pong(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close() }()
	_, _ = conn.Write([]byte("PING\r\n"))
	buf := make([]byte, 64)
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	n, _ := conn.Read(buf)
	return strings.HasPrefix(string(buf[:n]), "+PONG")
}

// Stop kills the process (SIGKILL: no goodbye to clients) and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process must wake to die
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open and nothing answers, like a
// network partition that drops packets.
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause (SIGCONT).
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Restart stops and starts the server on the same port and directory.
func (s *Server) Restart() {
	s.Stop()
	s.Start()
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: free port: %v", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// Eventually polls cond every 10ms until it is true or the deadline passes.
func Eventually(tb testing.TB, within time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	if !Within(within, cond) {
		tb.Fatalf("redistest: timed out after %s waiting for: %s", within, fmt.Sprintf(format, args...))
	}
}

// Within polls cond every 10ms and reports whether it held before within passed: for a
// caller whose failure message names what it saw last (Eventually's arguments are
// read when it is called).
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// RoundTrips is a go-redis hook that counts what a client sends: one per command outside
// a pipeline, one per pipeline. Add it with client.AddHook.
type RoundTrips struct{ n atomic.Int64 }

// Count is the number of round trips so far.
func (r *RoundTrips) Count() int64 { return r.n.Load() }

// Reset sets the count to zero.
func (r *RoundTrips) Reset() { r.n.Store(0) }

// DialHook implements redis.Hook.
func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}

// ProcessPipelineHook implements redis.Hook.
func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// ModuleRoot returns the directory of the go.mod above the test's working directory,
// for tests that read the module's own files.
func ModuleRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("redistest: no go.mod above the test's directory")
		}
		dir = parent
	}
}
