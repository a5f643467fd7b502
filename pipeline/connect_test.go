package pipeline_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline"
)

// connectCause is one failed Connect: the error it must wrap, what its message must
// say, and the other causes it must not claim.
type connectCause struct {
	url  string
	want error
	says []string
}

func (c connectCause) check(t *testing.T) {
	t.Helper()
	_, err := pipeline.Connect(context.Background(), c.url)
	if err == nil {
		t.Fatalf("%s: Connect succeeded", c.url)
	}
	for _, kind := range []error{pipeline.ErrRedisUnreachable, pipeline.ErrRedisAuth, pipeline.ErrRedisNoDB, pipeline.ErrRedisTLS} {
		if got := errors.Is(err, kind); got != errors.Is(kind, c.want) {
			t.Errorf("%s: errors.Is(%v) = %v: %v", c.url, kind, got, err)
		}
	}
	for _, s := range c.says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: message lacks %q: %v", c.url, s, err)
		}
	}
}

// A server that answers PING with an error is up: Connect says why it refused (a
// database it does not have, a TLS it does not speak) instead of "unreachable", which
// would send its user to start a server that already runs. Only an address nobody
// listens at is unreachable.
func TestConnectNamesTheCause(t *testing.T) {
	t.Parallel()
	shared, err := url.Parse(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	db99 := *shared
	db99.Path = "/99"
	tlsURL := *shared
	tlsURL.Scheme, tlsURL.Path = "rediss", "/0"
	for _, c := range []connectCause{
		{db99.String(), pipeline.ErrRedisNoDB, []string{"redis has no such database", "ERR DB index is out of range", "no database 99", "0 to "}},
		{"redis://127.0.0.1:" + itoa(redistest.FreePort(t)) + "/0", pipeline.ErrRedisUnreachable, []string{"redis unreachable", "connection refused"}},
		{tlsURL.String(), pipeline.ErrRedisTLS, []string{"the URL asks for TLS", "use redis://"}},
		{"redis://" + tlsListener(t) + "/0", pipeline.ErrRedisTLS, []string{"if it speaks TLS, use rediss://"}},
	} {
		c.check(t)
	}
}

// A server that refuses the URL's credentials, or wants some the URL lacks, is named as
// such, with the password left out.
func TestConnectNamesRefusedCredentials(t *testing.T) {
	// Not parallel: it runs a redis-server of its own.
	s := redistest.StartServer(t, redistest.ServerOptions{})
	if err := s.Client().ConfigSet(context.Background(), "requirepass", "sekrit").Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []connectCause{
		{"redis://:hunter2@" + s.Addr() + "/0", pipeline.ErrRedisAuth, []string{"redis refused the credentials", "WRONGPASS", "the server is up"}},
		{"redis://" + s.Addr() + "/0", pipeline.ErrRedisAuth, []string{"NOAUTH"}},
		{"redis://bob:hunter2@" + s.Addr() + "/0", pipeline.ErrRedisAuth, []string{"WRONGPASS"}},
		{"redis://:sekrit@" + s.Addr() + "/99", pipeline.ErrRedisNoDB, []string{"no database 99"}},
	} {
		c.check(t)
		if _, err := pipeline.Connect(context.Background(), c.url); strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "sekrit") {
			t.Errorf("the message shows the password: %v", err)
		}
	}
	if _, err := pipeline.Connect(context.Background(), "redis://:sekrit@"+s.Addr()+"/0"); err != nil {
		t.Fatalf("the right password: %v", err)
	}
}

// tlsListener is a TLS server that hangs up on a plain client, as a TLS Redis does.
func tlsListener(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	return l.Addr().String()
}
