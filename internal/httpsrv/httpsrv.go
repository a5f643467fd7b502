// Package httpsrv builds ymirflow's HTTP servers (metrics and health, fakejira, webhooks)
// with limits on every phase of a connection, so that slow or idle clients cannot pin
// file descriptors and goroutines: net/http sets none by default.
package httpsrv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Limits of one server; zero fields take the Default* values.
type Limits struct {
	ReadHeaderTimeout time.Duration // the request line and headers
	ReadTimeout       time.Duration // the whole request, body included
	WriteTimeout      time.Duration // from the end of the headers to the end of the response
	IdleTimeout       time.Duration // a keep-alive connection waiting for its next request
	MaxHeaderBytes    int
}

// Defaults: a metrics scrape or a Jira call takes milliseconds; a minute of idleness
// covers a Prometheus scrape interval's connection reuse.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 15 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// New returns a server of h with l's limits.
func New(h http.Handler, l Limits) *http.Server {
	or := func(d, def time.Duration) time.Duration {
		if d <= 0 {
			return def
		}
		return d
	}
	maxHeader := l.MaxHeaderBytes
	if maxHeader <= 0 {
		maxHeader = DefaultMaxHeaderBytes
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: or(l.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       or(l.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      or(l.WriteTimeout, DefaultWriteTimeout),
		IdleTimeout:       or(l.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    maxHeader,
	}
}

// IdleClosed opens n keep-alive connections to addr, makes one GET of path on each, then
// leaves them idle, and reports an error unless the server closes every one within
// within. Tests of the servers built with New use it.
func IdleClosed(addr, path string, n int, within time.Duration) error {
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	deadline := time.Now().Add(within)
	for i, c := range conns {
		_ = c.SetReadDeadline(deadline)
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("idle connection %d of %d still open after %s", i+1, n, within)
		}
	}
	return nil
}
