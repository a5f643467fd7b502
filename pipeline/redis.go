package pipeline

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// Why Connect's PING failed. Each error of Connect wraps one of them (or, for another
// error the server answered with, none), the URL without its password, and the client's
// own error.
var (
	// ErrRedisUnreachable: nobody answered: nothing listens at the address, the host
	// name does not resolve, or no answer came in time.
	ErrRedisUnreachable = errors.New("redis unreachable")
	// ErrRedisAuth: the server answered and refused the URL's user or password
	// (WRONGPASS, NOAUTH) or the user's permission to run PING or SELECT (NOPERM).
	ErrRedisAuth = errors.New("redis refused the credentials")
	// ErrRedisNoDB: the server answered and has no database with the URL's number.
	ErrRedisNoDB = errors.New("redis has no such database")
	// ErrRedisTLS: the client and the server disagree on TLS (rediss:// against a plain
	// server, or redis:// against a TLS one), or the TLS handshake failed.
	ErrRedisTLS = errors.New("redis TLS mismatch")
)

// ClientOptions parses a Redis URL (redis://, rediss://, user:password@, /db) into
// universal options; several comma-separated host:port pairs select Redis Cluster
// (redis://h1:7000,h2:7001), and the scheme redis+sentinel:// (rediss+sentinel:// for
// TLS) selects a primary found through Sentinel (see SentinelURLForm).
func ClientOptions(rawURL string) (*redis.UniversalOptions, error) {
	if rawURL == "" {
		return nil, errors.New("pipeline: the Redis URL is empty")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return nil, fmt.Errorf("pipeline: Redis URL %s: not a URL", redact.URL(rawURL))
	}
	switch u.Scheme {
	case "redis", "rediss":
	case "redis+sentinel", "rediss+sentinel":
		return sentinelOptions(rawURL, u)
	default:
		return nil, fmt.Errorf("pipeline: Redis URL %s: scheme must be redis://, rediss://, redis+sentinel:// or rediss+sentinel://", redact.URL(rawURL))
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

// SentinelURLForm is the form of a Sentinel URL, for messages about one that is not.
const SentinelURLForm = "redis+sentinel://[user:password@]sentinel1:26379[,sentinel2:26379...]/MASTER_NAME[/DB][?sentinel_username=U&sentinel_password=P]"

// sentinelOptions parses a Sentinel URL: the hosts are the Sentinels (port 26379 when
// left out), the path's first part is the name Sentinel monitors the primary under,
// the second the database; user and password are the data nodes' (as in redis://),
// sentinel_username and sentinel_password the Sentinels' own when they need any.
// rediss+sentinel:// speaks TLS to the data nodes and the Sentinels.
//
// go-redis's ParseFailoverURL takes one Sentinel in the host and the others as ?addr=,
// and puts the URL's credentials on the Sentinels: a form unlike every other REDIS_URL.
// This one keeps the host list of the Cluster form and the credentials where redis://
// has them.
func sentinelOptions(rawURL string, u *url.URL) (*redis.UniversalOptions, error) {
	bad := func(why string) error {
		return fmt.Errorf("pipeline: Redis URL %s: %s; the form is %s", redact.URL(rawURL), why, SentinelURLForm)
	}
	if u.Host == "" {
		return nil, bad("no Sentinel host")
	}
	var addrs []string
	for _, h := range splitHosts(u.Host) {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, "26379")
		}
		addrs = append(addrs, h)
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if parts[0] == "" {
		return nil, bad("no master name (the path's first part)")
	}
	if len(parts) > 2 {
		return nil, bad("the path has more than a master name and a database")
	}
	db := 0
	if len(parts) == 2 {
		n, err := strconv.Atoi(parts[1])
		if err != nil || n < 0 {
			return nil, bad(fmt.Sprintf("database %q is not a number", parts[1]))
		}
		db = n
	}
	uo := &redis.UniversalOptions{
		Addrs:           addrs,
		MasterName:      parts[0],
		DB:              db,
		DisableIdentity: true, ContextTimeoutEnabled: true, DialTimeout: 5 * time.Second, MaxRetries: 3,
	}
	if u.User != nil {
		uo.Username = u.User.Username()
		uo.Password, _ = u.User.Password()
	}
	for k, v := range u.Query() {
		switch k {
		case "sentinel_username":
			uo.SentinelUsername = v[0]
		case "sentinel_password":
			uo.SentinelPassword = v[0]
		default:
			return nil, bad(fmt.Sprintf("unknown parameter %q", k))
		}
	}
	if strings.HasPrefix(u.Scheme, "rediss") {
		host, _, _ := net.SplitHostPort(addrs[0])
		uo.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
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
		return nil, pingFailure(ctx, &probeOpts, redact.URL(rawURL), err)
	}
	return redis.NewUniversalClient(o), nil
}
