// Package lockmw is the Watermill middleware on ymirflow's per-issue lease (package
// lease): each message runs under its issue's lease, and an event whose issue is busy
// is dropped, coalesced, delayed, delivered to the holder's run, supersedes it, or
// waits in the key's line for its turn, by its event type's busy policy (Policies).
//
// It speaks the event format (package event) where a message's metadata or a stream
// entry is concerned, by that package's names: the issue key it reads by default and
// the fence it writes (event.MetaIssueKey, event.MetaFence), the comment fields of a
// follow-up, the delayed set of policy Delay (delayq.Key) and the fencer that
// event's writers find in the handler's context (event.WithFencer). The caller gives it
// the conflict recorder (Config.OnConflict) and, for messages read from a Redis stream,
// the Source that names each message's entry. With a Source it acks the entry in the
// release's round trip and, when the Source knows the entry it delivers next (Peeker),
// takes that entry's lease in the same round trip (lease.Lease.Handoff).
//
// Files: doc.go (this overview), middleware.go (Middleware, Config, LeaseFrom, and
// Handler's steps), runend.go (how a run under a lease ends, and the writes each end
// makes), conflict.go (events whose issue is busy, and runs a newer event cancelled),
// policy.go (the busy-policy table), wait.go (the wait policy: the waiting event's
// copy, the end of its turn, the line waker), handoff.go (the leases taken ahead for
// the next entries, given back if those entries do not come), batch.go (quick runs'
// ends sent in batches that take the next entries' leases), wakeup.go (the deliver
// policy's follow-ups and wake-ups), slots.go (concurrency limits: RUN_LIMITS slots taken
// before the lease, fair waiting, the slot waker), slots_trace.go (their span events),
// pause.go (the pause check after the acquire, or in the batch that took the lease
// ahead: an event of a paused scope is parked),
// trace.go (span events), errors.go. The code map
// in docs/development.md names each concept's file.
package lockmw
