package redisinfo_test

import (
	"context"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redisinfo"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// The test server is recent enough; an older one gets the reason it is too old; the
// embedded miniredis (no INFO server) is unknown, never an error or a warning.
func TestServerVersionAndTheMinimum(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Client(t)
	s, err := redisinfo.ServerInfo(context.Background(), rdb)
	if err != nil || !s.Known() || s.Old() != "" {
		t.Fatalf("ServerInfo = %+v, %v (old: %q)", s, err, s.Old())
	}
	for _, c := range []struct{ version, says string }{
		{"6.2.14", "lag"}, {"6.0.16", "XAUTOCLAIM"}, {"7.0.0", ""}, {"7.10.1", ""},
	} {
		if got := (redisinfo.Server{Name: "redis", Version: c.version}).Old(); (c.says == "") != (got == "") || !strings.Contains(got, c.says) {
			t.Errorf("Old(%s) = %q, want it to mention %q", c.version, got, c.says)
		}
	}
	mr := miniredis.RunT(t)
	m := redis.NewClient(&redis.Options{Addr: mr.Addr(), DisableIdentity: true})
	defer m.Close()
	if s, err := redisinfo.ServerInfo(context.Background(), m); err != nil || !s.Embedded() || s.Old() != "" {
		t.Fatalf("ServerInfo(miniredis) = %+v, %v", s, err)
	}
}

// A user the ACL forbids INFO talks to a real server: that is an error (version
// unknown), never the embedded Redis, whose partial answers the views would then hide.
func TestServerInfoUnderAnACLWithoutInfo(t *testing.T) {
	// Not parallel: it starts a redis-server of its own; server start-ups beside other tests on a 2-core CI machine slow them all.
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	ctx := context.Background()
	if err := srv.Client().Do(ctx, "ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "noinfo", Password: "pw", DisableIdentity: true})
	defer c.Close()
	s, err := redisinfo.ServerInfo(ctx, c)
	if err == nil || !strings.Contains(err.Error(), "NOPERM") || s.Embedded() && s.Name == "unknown" {
		t.Fatalf("ServerInfo without +info = %+v, %v; want a NOPERM error", s, err)
	}
}
