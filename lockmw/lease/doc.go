// Package lease is ymirflow's fenced per-issue lease, as a library: acquire,
// heartbeat, extend, release, the hand-off of a stream entry's lease to the next
// entry's, fencing, key canonicalisation and the operators' view. It needs a Redis
// client (Client, which redis.UniversalClient satisfies) and nothing of Watermill;
// package lockmw builds the Watermill middleware on it.
//
// A lease is a Redis key lock:<agent>:<ISSUE> (the Python ymir agents' key, so both can
// run side by side) holding a random token, taken with SET NX PX in a script that also
// hands out a fence number: an INCR of a counter that never expires, so each acquisition
// of a key gets a fence above every earlier one. A heartbeat extends the lease every
// TTL/3 with a compare-and-PEXPIRE; Release is a compare-and-delete. A foreign lease is
// never extended or deleted. Every way a lease ends is one release step (scripts/
// lease.lua) told whether a run happened (Release) or not (GiveBack: no release
// record, so no event counts as superseded by it), and every release publishes the
// follow-up queued behind the lease, if there is one.
//
// Unlike the Python lock, loss is loud: the lease's Context is cancelled with a typed
// cause when Redis says the key is no longer ours (ErrLeaseLost), when no extend has
// succeeded for TTL minus a safety margin (ErrLeaseUnproven: the key may have expired
// while Redis was unreachable), or when the lease has been held for MaxHold
// (ErrMaxHold). Redis blips shorter than that never cancel work. Writes made under a
// lease go through Lease.XAdd, which refuses them once the lease is gone, so a paused or
// partitioned holder cannot publish after another holder has taken over.
//
// Round trips: one to acquire (with the fence and the operator record), one to release,
// one per heartbeat. ReleaseWith folds more commands (an XACK) into the release's round
// trip; Handoff also takes the next stream entry's lease in it, so a stream of events
// costs one round trip each.
//
// Files: doc.go (this overview), errors.go (sentinels and typed errors), locker.go
// (Locker, Acquire), lease.go (Lease: heartbeat, release, fenced writes), handoff.go
// (the next entry's lease taken in the release's round trip), batch.go (several runs
// ended and several leases taken ahead in one round trip), keys.go (key names and
// canonical issue keys), scope.go (shared keys: scopes issue and group), fenced.go
// (checks of every lock key of a lease), mailbox.go (the deliver policy's follow-ups),
// line.go (the wait policy's line: joining it, the release that hands the key to its
// head, the wake of a stranded line), line_scoped.go (the line on a shared key: wait
// under scopes issue and group), inspect.go (the operators' view), evict.go
// (force releases and take-overs end the lease at once, also when announced while
// nobody listened), starter.go (heartbeats started when due), giveup.go (a holder ends its own lease, as MaxHold does), pause.go (pauses: the
// registry, park and resume), slots.go (concurrency
// limits: slots per limit key, their fair waiting lines and hand-on), slots_lease.go (a
// run's slots taken, renewed and freed in its lease's own scripts on standalone Redis),
// replicas.go (WAIT for
// replicas after each acquire and extend, Options.WaitReplicas; no key taken while
// they lag), scripts.go and scripts/*.lua (the atomic steps, embedded, after xonce's
// issue-index step; line.lua and the scripts that use it are loaded by line.go). The
// code map in docs/development.md names each concept's file.
package lease
