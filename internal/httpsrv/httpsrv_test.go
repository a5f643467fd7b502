package httpsrv_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/httpsrv"
)

// serve starts srv on a loopback port and returns its address.
func serve(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestIdleKeepAliveConnectionsClosed(t *testing.T) {
	// Not parallel: it times a 200 ms idle timeout against connections kept open.
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	addr := serve(t, httpsrv.New(h, httpsrv.Limits{IdleTimeout: 200 * time.Millisecond}))
	if err := httpsrv.IdleClosed(addr, "/", 300, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Without an idle timeout the same connections stay open: the check can fail.
	srv := &http.Server{Handler: h}
	addr = serve(t, srv)
	if err := httpsrv.IdleClosed(addr, "/", 3, 500*time.Millisecond); err == nil {
		t.Fatal("IdleClosed passed against a server without an idle timeout")
	}
}

// A client that never finishes its headers (slowloris) is cut off, and so are oversized
// headers.
func TestSlowAndOversizedHeaders(t *testing.T) {
	// Not parallel: it times a 200 ms header timeout against a slow client.
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	srv := httpsrv.New(h, httpsrv.Limits{ReadHeaderTimeout: 200 * time.Millisecond})
	addr := serve(t, srv)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("slow client: %v (want the server to close)", err)
	}

	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = io.WriteString(c2, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", httpsrv.DefaultMaxHeaderBytes+8192)+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized headers: %v %v", resp, err)
	}
	if srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 {
		t.Fatalf("limits left unset: %+v", srv)
	}
}
