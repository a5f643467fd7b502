// Package lockmw is the Watermill middleware on ymirflow's per-issue lease (package
// lease): each message runs under its issue's lease, and an event whose issue is busy
// goes where its event type's policy says: dropped, coalesced, delivered, delayed or
// superseding the run (Policies).
//
// The Middleware reads of a message only what package event names (the event type and
// the delay metadata, the delayed queue, the fencer of fenced writes): the caller gives
// it the issue key extractor (Config.IssueKey) and the conflict recorder
// (Config.OnConflict), and, for messages read from a Redis stream, the Source that
// names each message's entry.
// With a Source it acks the entry in the release's round trip and, when the Source
// knows the entry it delivers next (Peeker), takes that entry's lease in the same
// round trip (lease.Lease.Handoff).
//
// Files: the code map in docs/development.md names each concept's file.
package lockmw
