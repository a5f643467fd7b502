package main

import (
	"context"
	"io"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/config"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline"
)

// env is what every command that talks to Redis starts from.
type env struct {
	log      zerolog.Logger
	rdb      redis.UniversalClient
	opts     *redis.UniversalOptions
	topology pipeline.Topology
}

// connect builds the logger and a Redis client that has answered PING. Redis
// unreachable at start is one clear line naming the URL without its password (exit 1).
func connect(ctx context.Context, c *config.Common, stderr io.Writer) (*env, error) {
	log, err := pipeline.NewLogger(stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return nil, usagef("LOG_LEVEL: %v", err)
	}
	// go-redis logs dial failures itself, unstructured, before we can say anything
	// clearer; route them into our log at debug level. (The library only offers a
	// process-wide setting; cmd owns the process.)
	redis.SetLogger(goRedisLogger{log})
	opts, err := pipeline.ClientOptions(c.RedisURL)
	if err != nil {
		return nil, usagef("%v", err)
	}
	rdb, err := pipeline.Connect(ctx, c.RedisURL)
	if err != nil {
		return nil, err // names the URL, without its password
	}
	return &env{log: log, rdb: rdb, opts: opts, topology: pipeline.Topology{Namespace: c.Namespace}}, nil
}

func (e *env) Close() { e.rdb.Close() }

// newLocker returns the process's lease handler with the key layout every command must
// agree on: the namespace's scope, and hash-tagged keys on Redis Cluster.
func (e *env) newLocker(o lockmw.Options) (*lockmw.Locker, error) {
	o.Scope = e.topology.LockScope()
	if e.opts.IsClusterMode {
		o.Format = lockmw.KeysCluster
	}
	o.Logger = e.log
	return lockmw.New(e.rdb, o)
}

type goRedisLogger struct{ log zerolog.Logger }

func (g goRedisLogger) Printf(_ context.Context, format string, v ...any) {
	g.log.Debug().Str("component", "go-redis").Msgf(format, v...)
}
