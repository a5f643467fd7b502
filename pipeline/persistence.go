package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redisinfo"
)

// ErrNoAOF is CheckPersistence's refusal: the server keeps no append-only file (or
// cannot be asked), and requireAOF was set.
var ErrNoAOF = errors.New("redis keeps no append-only file")

// CheckPersistence warns when rdb's server keeps no append-only file: the lease's
// fence counters live in Redis, and a restart that loses them hands the same fences
// out again (docs/architecture.md, "Edge cases settled"). With requireAOF it refuses
// instead (an error wrapping ErrNoAOF), also when the server cannot be asked (an ACL
// without INFO). It is what the worker calls at start.
func CheckPersistence(ctx context.Context, rdb redis.UniversalClient, log zerolog.Logger, requireAOF bool) (redisinfo.Persistence, error) {
	p, err := redisinfo.PersistenceInfo(ctx, rdb)
	if err != nil {
		if requireAOF {
			return p, fmt.Errorf("%w: cannot tell (%w); allow the worker's Redis user INFO, or unset the requirement", ErrNoAOF, err)
		}
		log.Info().Err(err).Msg("could not ask Redis what it persists; fences repeat after a restart that loses writes")
		return p, nil
	}
	why := p.Lossy()
	switch {
	case why == "":
		return p, nil
	case requireAOF:
		return p, fmt.Errorf("%w: %s", ErrNoAOF, why)
	}
	log.Warn().Bool("aof", p.AOF).Str("save", p.Save).Msg(why)
	return p, nil
}
