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
// Each subscription reads with a subscriber.Subscriber (the package subscriber: our
// read loop on go-redis, no hook on any client) and keeps the pipeline's view of what it
// read ahead (docs/architecture.md, "The read path"): a claim veto that refuses entries
// whose lease is alive, the next entry's issue for the lease taken in the release's
// round trip (Peek), the newer events that may supersede the run under way (Waiting),
// the batching rule and the hand-back of a batch waiting behind a long event, and a
// start-up pass that re-marks this consumer's own pending entries idle so a restarted
// worker resumes them at once. The lock middleware acks each entry it ends in its
// release's round trip and settles it; the subscriber acks only the others.
package pipeline
