// Package redisinfo says which Redis (or Valkey) a client talks to and whether it is
// recent enough for the pipeline: the version check behind pipeline.WarnOldServer, and
// the views' test for the embedded Redis, whose XINFO replies are partial.
package redisinfo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// MinRedisVersion is the oldest Redis the pipeline is built for (README, "Requirements"):
// XPENDING with IDLE and XAUTOCLAIM (Watermill's claim loop, 6.2) and the lag and
// entries-read of XINFO GROUPS (the views, 7.0). Valkey, which forked from Redis 7.2,
// has them all.
const MinRedisVersion = "7.0.0"

// Server is what INFO server says about the Redis a client talks to.
type Server struct {
	// Name is "redis", "valkey", or "unknown" for a server whose INFO names no
	// version (the embedded miniredis, some proxies).
	Name    string
	Version string // e.g. "7.2.4"; "" when unknown
}

// Known reports whether the server said which version it is.
func (s Server) Known() bool { return s.Version != "" }

// Embedded reports a server that does not answer INFO server (miniredis): its XINFO
// replies are partial (no consumer idle times, lag as the stream's length).
func (s Server) Embedded() bool { return !s.Known() }

func (s Server) String() string {
	if !s.Known() {
		return "an unknown server (no version in INFO server)"
	}
	return s.Name + " " + s.Version
}

// Old returns why the server is older than the pipeline needs, or "" when it is recent
// enough (or does not say: the embedded Redis is exercised by the demo's own tests).
func (s Server) Old() string {
	if !s.Known() || s.Name == "valkey" || versionAtLeast(s.Version, MinRedisVersion) {
		return ""
	}
	if !versionAtLeast(s.Version, "6.2.0") {
		return fmt.Sprintf("%s is older than %s: the claim loop's XPENDING IDLE and XAUTOCLAIM need 6.2, so entries of dead workers are never recovered", s, MinRedisVersion)
	}
	return fmt.Sprintf("%s is older than %s: XINFO GROUPS has no lag, so the views show it as ?", s, MinRedisVersion)
}

// ServerInfo asks rdb's server (one node, for a cluster client any) for its name and
// version with INFO server. A server that does not know INFO server is
// Server{Name: "unknown"} and no error; a connection failure, or an ACL that forbids
// INFO (NOPERM), is an error.
func ServerInfo(ctx context.Context, rdb redis.UniversalClient) (Server, error) {
	txt, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		var re redis.Error
		// A reply, not a network failure: a server that does not know INFO server (the
		// embedded miniredis). A user the ACL forbids INFO (NOPERM) talks to a real
		// server whose version is unknown, which is not the same thing: an error.
		if errors.As(err, &re) && !redis.HasErrorPrefix(err, "NOPERM") {
			return Server{Name: "unknown"}, nil
		}
		return Server{}, fmt.Errorf("INFO server: %w", err)
	}
	s := Server{Name: "redis"}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "redis_version":
			if s.Version == "" {
				s.Version = v
			}
		case "valkey_version":
			s.Name, s.Version = "valkey", v
		case "server_name":
			if v == "valkey" {
				s.Name = "valkey"
			}
		}
	}
	if s.Version == "" {
		s.Name = "unknown"
	}
	return s, nil
}

// versionAtLeast compares dotted versions numerically ("7.10.0" > "7.2.4").
func versionAtLeast(v, minimum string) bool {
	a, b := strings.Split(v, "."), strings.Split(minimum, ".")
	for i := range max(len(a), len(b)) {
		x, y := 0, 0
		if i < len(a) {
			x, _ = strconv.Atoi(strings.TrimFunc(a[i], func(r rune) bool { return r < '0' || r > '9' }))
		}
		if i < len(b) {
			y, _ = strconv.Atoi(b[i])
		}
		if x != y {
			return x > y
		}
	}
	return true
}
