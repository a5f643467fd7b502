package pipeline

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// pingFailure names why the probe's PING failed: a server that answered with an error
// is up, so "unreachable" would send its user to start one that already runs.
func pingFailure(ctx context.Context, o *redis.UniversalOptions, url string, err error) error {
	var answered redis.Error
	switch {
	case redis.IsAuthError(err) || redis.IsPermissionError(err):
		return fmt.Errorf("%w: %s: %w (the server is up: check the user and password in the URL, and the user's ACL)", ErrRedisAuth, url, err)
	case redis.HasErrorPrefix(err, "DB index is out of range"):
		return fmt.Errorf("%w: %s: %w (the server is up, but has no database %d; %s)", ErrRedisNoDB, url, err, o.DB, databases(ctx, o))
	case errors.As(err, &answered):
		return fmt.Errorf("redis answered PING with an error: %s: %w", url, err)
	case tlsMismatch(ctx, o, err):
		if o.TLSConfig != nil {
			return fmt.Errorf("%w: %s: %w (the URL asks for TLS, rediss://, and the server did not answer the TLS handshake: "+
				"for a server without TLS use redis://)", ErrRedisTLS, url, err)
		}
		return fmt.Errorf("%w: %s: %w (the server closed the connection before answering: "+
			"if it speaks TLS, use rediss://)", ErrRedisTLS, url, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrRedisUnreachable, url, err)
}

// tlsMismatch reports an error that comes of a client and a server disagreeing on TLS:
// a TLS error; with TLS, no answer to the handshake from an address that accepts
// connections (a plain Redis waits for the end of a command line that a ClientHello
// never sends); without, a connection closed or reset once made (a TLS server hangs up
// on a plain command).
func tlsMismatch(ctx context.Context, o *redis.UniversalOptions, err error) bool {
	var rec tls.RecordHeaderError
	var alert tls.AlertError
	if errors.As(err, &rec) || errors.As(err, &alert) || strings.Contains(err.Error(), "tls: ") {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false // no connection made: unreachable, whatever the scheme
	}
	if o.TLSConfig != nil {
		var ne net.Error
		timedOut := errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
		return timedOut && len(o.Addrs) > 0 && listening(ctx, o.Addrs[0])
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// listening reports whether addr accepts a TCP connection within a second.
func listening(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// databases says how many databases the server has, asked on database 0 (CONFIG GET
// databases), or the default when it does not say (CONFIG refused to the user).
func databases(ctx context.Context, o *redis.UniversalOptions) string {
	db0 := *o
	db0.DB = 0
	c := redis.NewUniversalClient(&db0)
	defer func() { _ = c.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := c.ConfigGet(cctx, "databases").Result()
	if n, convErr := strconv.Atoi(v["databases"]); err == nil && convErr == nil && n > 0 {
		return fmt.Sprintf("it has %d: 0 to %d", n, n-1)
	}
	return "a server has 16 by default, 0 to 15 (redis.conf's databases)"
}
