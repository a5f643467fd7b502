// Package pipeline wires ymirflow's event pipeline: the event envelope, the stream
// topology (agent and branch to stream and consumer group), Redis clients, Watermill
// publishers, subscribers and routers over Redis Streams, the middleware stack, the
// results and dead-letter streams, logging, metrics and health.
//
// The entry point is NewRouter: one router per worker process, one handler per input
// stream of the agent (and per unit of CONCURRENCY), each wrapped, outermost first, in
// recoverer → correlation → metrics → dead letters → lockmw → retry → timeout → handler.
//
// watermill-redisstream is used as it is, with three fixes around it (docs/architecture.md,
// "Living with watermill-redisstream"): a
// go-redis hook on each subscriber's own client stamps every entry with its stream id,
// so the lease can guard and refresh it, and skips the subscriber's XACK when the lock
// middleware already acked the entry in its release round trip; a claim veto refuses
// entries whose lease is alive; and a start-up pass re-marks this consumer's own pending
// entries idle so a restarted worker resumes them at once.
package pipeline
