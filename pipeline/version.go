package pipeline

import (
	"context"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redisinfo"
)

// WarnOldServer logs a warning when rdb's server is older than
// redisinfo.MinRedisVersion; it is what the commands call at start. It never fails the
// start: a server that cannot be asked is reported by the command's own ping.
func WarnOldServer(ctx context.Context, rdb redis.UniversalClient, log zerolog.Logger) redisinfo.Server {
	s, err := redisinfo.ServerInfo(ctx, rdb)
	if err != nil {
		log.Debug().Err(err).Msg("could not ask Redis for its version")
		return s
	}
	if why := s.Old(); why != "" {
		log.Warn().Str("server", s.String()).Str("minimum", "redis "+redisinfo.MinRedisVersion+" or valkey 7.2").Msg(why)
	}
	return s
}
