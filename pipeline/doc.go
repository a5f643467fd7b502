// Package pipeline runs ymirflow's workers: one Watermill router per worker process
// over Redis Streams, with the middleware stack around each handler, the dead-letter
// stream, retries, metrics and health, worker presence, the consumer-name claim, and the
// Redis client and version check the commands start with. The wire format it reads and
// writes (envelope, marshal/decode, bounds, topology, publisher, results, trim) is the
// leaf package event.
//
// The entry point is NewRouter: one router per worker process, one handler per input
// stream of the agent (and per unit of RouterConfig.Concurrency), each wrapped,
// outermost first, in recoverer → correlation → metrics → dead letters → lockmw → retry
// → timeout → handler.
//
// watermill-redisstream is used as it is, with three fixes around it (docs/architecture.md,
// "Living with watermill-redisstream"): a
// go-redis hook on each subscriber's own client stamps every entry with its stream id,
// so the lease can guard and refresh it, and skips the subscriber's XACK when the lock
// middleware already acked the entry in its release round trip; a claim veto refuses
// entries whose lease is alive; and a start-up pass re-marks this consumer's own pending
// entries idle so a restarted worker resumes them at once.
package pipeline
