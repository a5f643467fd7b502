// Package ratelimit is the budget that every ymirflow process shares through Redis: a
// rate per name (Jira requests, run starts of an agent, an agent's calls to a named
// upstream), and a pause per name that one process sets for all of them when the
// upstream answers 429 with Retry-After.
//
// The rate is GCRA (the generic cell rate algorithm) from github.com/go-redis/redis_rate,
// on the server's clock: Rate{N: 5, Per: time.Second, Burst: 5} lets an idle budget
// spend 5 at once and then one every 200 ms, so over any window T at most Burst + T×N/Per
// are permitted, whatever the number of processes asking. A refusal costs nothing.
//
// The pause is one key with an expiry (PX, the server's clock): Throttle sets it, never
// shortening a longer one already set; Permit reads it before asking GCRA, so while it
// lives nobody is permitted, and a crashed process leaves nothing behind that outlives
// its expiry.
//
// Permit is the non-blocking question (may I, and if not, when should I ask again);
// Wait blocks until permitted, booking its slot on the same GCRA state
// (scripts/reserve.lua) so that waiters are served in the order they asked, not the
// one that wakes first each time; Budget binds both and Throttle to one name, for a client
// (internal/jira's Options.Shared). Refusals are counted (Metrics) and recorded as
// events on the caller's span (ratelimit.throttled, ratelimit.permitted).
//
// Keys, in the caller's Prefix (e.g. "ymir:ratelimit:"): "rate:<Prefix><name>" (GCRA's
// state; redis_rate puts "rate:" in front) and "<Prefix><name>:pause". Each command
// touches one key, so Redis Cluster needs no hash tag.
package ratelimit
