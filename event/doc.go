// Package event is ymirflow's wire format: what an event is on a Redis stream and how
// it is named, written and read, for every program that produces or reads events
// (workers, the fetcher, the webhook, the operator views), with no router and no lease.
//
// An event is a Watermill message: a UUID, the Python system's Task JSON as payload
// (Task, ParseTask), and metadata (the Meta* keys: issue key, event type, schema
// version, correlation and causation ids, attempt, fence). New builds one; Encode and
// the Marshaller write it as one readable field per metadata key ("m:issue_key") and
// still read the msgpack metadata of a stock watermill-redisstream publisher;
// DecodeEntry reads any entry and never fails: an undecodable or oversized one
// (DefaultMaxEventBytes, MaxEventFields) comes back marked bad (BadReason), with a
// bounded copy. Validate decides whether an event is fit for an agent and canonicalises
// its issue key with the function it is given (the lease's, e.g. a Locker's
// Canonicalize), so this package needs no lease.
//
// Topology names the streams and groups of each agent and branch and every other key
// of the pipeline (results, dead letters, queued markers, worker presence, consumer
// claims). Publisher appends events, Results appends and reads outcome records, and
// Trim keeps a stream short without ever cutting an entry a group still needs. Writes
// made under a lease (a context with WithFencer, which the lock middleware gives each
// handler) are fenced: refused once the lease is lost.
//
// What only the worker runtime and the operator's views need is not here: the delayed
// set of policy delay (internal/delayq), the drain requests (internal/drainreq) and the
// worker presence record (internal/presence).
package event
