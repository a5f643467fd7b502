// Package demo runs the whole ymirflow pipeline in one process, for `ymirflow demo`: an
// embedded Redis (miniredis) unless a real one is given, the fake Jira seeded with sample
// issues that exercise every path, one fetcher sweep, events published twice on
// purpose, two workers per stage (triage, and rebase, backport and rebuild on c9s and
// c10s) with simulated agents, and a second sweep that finds nothing new. It shows live
// counters while it runs and ends with a summary computed from the streams, the
// handlers' counts and the fake Jira's labels.
//
// The entry point is Run. What happens to each issue is its Scenario (Scenarios): the
// catalogue covers fresh issues, ymir_todo from a maintainer and from an outsider,
// ymir_retry_needed, stale in-flight labels, modular packages, every triage resolution,
// both branches, downstream success, failure then success, a crashing agent and
// exhausted retries. The agents are demorunner.Runner, told by the scenario which
// outcome to simulate at each attempt.
//
// # Duplicates
//
// Before any worker starts, some triage requests are appended a second time (as a
// producer retrying its XADD would) and some downstream requests are enqueued twice by
// hand. Whichever copy runs second finds the issue locked (the other copy is at work) or
// superseded (it entered its stream before the other copy's run ended): lockmw acks it
// and records lock.dropped. So the dropped count equals the number of duplicates, and
// every published event has exactly one outcome (stage.done, stage.failed or
// lock.dropped; a failed event is also in the dead-letter stream).
//
// # miniredis
//
// The embedded Redis is github.com/alicebob/miniredis/v2. Everything the pipeline needs
// works on it: consumer groups (XGROUP CREATE MKSTREAM, XREADGROUP with BLOCK, XACK,
// XPENDING with IDLE and a consumer, XCLAIM with IDLE and JUSTID, XAUTOCLAIM, XINFO,
// XGROUP DELCONSUMER, XADD MAXLEN ~, XTRIM MINID), SET NX PX, pipelines, EVAL/EVALSHA,
// and the Lua the lease and the fetcher run (redis.call('TIME'), string.match, unpack,
// redis.error_reply, HSET with many fields, XINFO GROUPS and XPENDING inside a script).
// Three differences matter, and the demo works around them:
//
//   - TTLs do not decrease unless told to (miniredis is made for unit tests): a lease
//     whose holder died would never expire. The demo turns on ClockTTL, so TTLs follow
//     the wall clock.
//   - XCLAIM ignores its min-idle-time: two consumers claiming the same idle entry both
//     get it. The pipeline's own XCLAIMs use min-idle 0, but watermill-redisstream's claim
//     loop relies on it; the demo sets MAX_IDLE_TIME beyond its own length, so nothing is
//     ever claimed (nothing needs to be: no worker dies).
//   - XINFO answers are thinner: XINFO GROUPS has no entries-read and its lag is the
//     stream's length; XINFO STREAM has no first or last entry. Only `ymirflow streams`
//     shows it (LAG, FIRST, LAST).
package demo
