// Package lockmw is the Watermill middleware on ymirflow's per-issue lease (package
// lease): each message runs under its issue's lease, and an event whose issue is busy
// is dropped or coalesced (Policy).
//
// The Middleware knows nothing of the messages' format: the caller gives it the issue
// key extractor (Config.IssueKey) and the conflict recorder (Config.OnConflict), and,
// for messages read from a Redis stream, the Source that names each message's entry.
// With a Source it acks the entry in the release's round trip and, when the Source
// knows the entry it delivers next (Peeker), takes that entry's lease in the same
// round trip (lease.Lease.Handoff).
//
// Files: middleware.go (Middleware, Config, LeaseFrom), conflict.go (events whose
// issue is busy), handoff.go (the lease taken ahead for the next entry, given back if
// that entry does not come), errors.go.
package lockmw
