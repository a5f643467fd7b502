package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// ErrRedisUnreachable is returned by Connect when Redis does not answer.
var ErrRedisUnreachable = errors.New("redis unreachable")

// ClientOptions parses a Redis URL (redis://, rediss://, user:password@, /db) into
// universal options; several comma-separated host:port pairs select Redis Cluster
// (redis://h1:7000,h2:7001).
func ClientOptions(rawURL string) (*redis.UniversalOptions, error) {
	if rawURL == "" {
		return nil, errors.New("pipeline: the Redis URL is empty")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return nil, fmt.Errorf("pipeline: Redis URL %s: not a URL", redact.URL(rawURL))
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("pipeline: Redis URL %s: scheme must be redis:// or rediss://", redact.URL(rawURL))
	}
	hosts := splitHosts(u.Host)
	single := *u
	single.Host = hosts[0]
	o, err := redis.ParseURL(single.String())
	if err != nil {
		pw, _ := u.User.Password()
		return nil, fmt.Errorf("pipeline: Redis URL %s: %s", redact.URL(rawURL), redact.New(pw).String(err.Error()))
	}
	uo := &redis.UniversalOptions{
		Addrs:    []string{o.Addr},
		Username: o.Username, Password: o.Password, DB: o.DB, TLSConfig: o.TLSConfig,
		DisableIdentity: true, // Redis 7.0 answers CLIENT SETINFO with an error: noise
		// Honour context deadlines on the wire, not only the fixed read timeout.
		ContextTimeoutEnabled: true,
		DialTimeout:           5 * time.Second,
		MaxRetries:            3,
	}
	if len(hosts) > 1 {
		uo.Addrs = hosts
		uo.IsClusterMode = true
	}
	return uo, nil
}

func splitHosts(h string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(h); i++ {
		if i == len(h) || h[i] == ',' {
			if i > start {
				out = append(out, h[start:i])
			}
			start = i + 1
		}
	}
	if len(out) == 0 {
		out = []string{"127.0.0.1:6379"}
	}
	return out
}

// NewClient returns a client for the Redis URL rawURL without connecting.
func NewClient(rawURL string) (redis.UniversalClient, error) {
	o, err := ClientOptions(rawURL)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(o), nil
}

// Connect returns a client for the Redis URL rawURL that has answered PING. The error names the
// URL without its password.
//
// The PING is sent by a probe client that dials once and does not retry: at start-up a
// refused connection is an answer, and the client's retries (go-redis's command retries
// with backoff, each with the pool's dial attempts 100ms apart) would only delay it by
// up to seconds. The returned
// client keeps its retries for the blips of a long run.
func Connect(ctx context.Context, rawURL string) (redis.UniversalClient, error) {
	o, err := ClientOptions(rawURL)
	if err != nil {
		return nil, err
	}
	probeOpts := *o
	probeOpts.MaxRetries = -1
	probeOpts.DialerRetries = 1 // attempts in all: the pool's default is 5, 100ms apart
	probeOpts.PoolSize = 1
	probe := redis.NewUniversalClient(&probeOpts)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = probe.Ping(pctx).Err()
	_ = probe.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRedisUnreachable, redact.URL(rawURL), err)
	}
	return redis.NewUniversalClient(o), nil
}
