// Package fetcher sweeps Jira for issues that need triage and publishes one triage request
// per issue to the pipeline's triage streams. It is the Go successor of the Python ymir
// jira_issue_fetcher (reference/upstream.md §4) with its weak points (§8 items 6–18) fixed.
//
// The entry point is New; (*Fetcher).Sweep runs one sweep and returns a Summary:
//
//  1. Search: JIRA_JQL through internal/jira's SearchAll (Jira Cloud's POST
//     /rest/api/3/search/jql paged by nextPageToken, Server/DC's /rest/api/2/search paged by
//     startAt; at most 5 requests/s; 429 and 5xx retried), asking only for the fields the
//     rules read: labels, updated, status, components, fixVersions and the downstream
//     component field (customfield_10669). Every key is canonicalised with lockmw.
//  2. Classify each issue with upstream rules A–D, no I/O: no ymir_* label → publish;
//     ymir_todo without an in-progress label → user-triggered (A); a stale in-flight label
//     (STALE_LABEL_THRESHOLD, default 24h, on the updated time, Jira's +0000 offsets
//     and naive timestamps read as UTC) → recovered (B); other ymir_* labels → skipped (C);
//     ymir_retry_needed without an in-progress label → retried (D). A modular package
//     (component like perl:5.32/perl) is skipped, and its ymir_todo consumed rather than
//     left to be re-checked every sweep (upstream §8 item 16).
//  3. Pre-check the whole batch in ONE pipelined round trip: EXISTS on the lease key of
//     every stage (triage, rebase, backport, rebuild: lockmw.Locker.Keys(agent, issue).Lock)
//     for every candidate, never SCAN (upstream SCANned the whole keyspace for triage
//     leases only, §8 items 6 and 18), plus the queued markers below. A locked issue is
//     left exactly as it is, trigger label included, and nothing is published: the first
//     sweep after the release takes it (the fix of the review finding "locked skip strands
//     trigger labels", without upstream's flip-and-drop of §8 item 7).
//  4. Per candidate, in Jira's order: MAX_ISSUES; for ymir_todo the check that whoever added
//     it last (newest add in the paginated changelog) is in JIRA_TRIGGER_GROUP (a
//     non-member's ymir_todo is removed); then PUBLISH, then FLIP the trigger label to
//     ymir_triage_in_progress. A label is never flipped without its publish: if the publish
//     fails nothing is written to Jira and the sweep stops; if the flip fails the request is
//     already out and the queued marker keeps the next sweep from publishing it again.
//     DRY_RUN writes nothing to Jira and still publishes.
//
// # Idempotent publish
//
// An issue whose triage request still waits in a triage stream (published, not yet acked)
// is not published again; this replaces upstream's LRANGE of 26 lists every sweep (§8
// items 12, 13, 17). The decision is made in Redis, O(1) per issue:
//
//   - Each publish goes through one Lua script that reads the marker key
//     "<ns>:queued:triage:<KEY>", and only if the entry it names is no longer waiting XADDs
//     the request and sets the marker to "<entry id> <stream>" with a TTL (QueuedTTL,
//     default 24h). Check and append are atomic, so two fetchers racing (the daily and the
//     todo CronJob) still publish once.
//   - "Waiting" means: the entry is after the triage group's last-delivered-id and still in
//     the stream (unread), or the group does not exist yet (workers create it from id 0),
//     or XPENDING finds exactly that id (delivered, not acked). So the marker needs no
//     cooperation from the triage handler: once the entry is acked (done, dropped or
//     dead-lettered) the marker is stale and the issue can be published again, whatever
//     the TTL. The TTL only bounds garbage; it is renewed whenever a sweep finds the entry
//     still waiting, so a backlog older than the TTL is not published twice.
//   - The pre-check reads the markers in the same round trip as the lease keys, with XINFO
//     GROUPS of the two triage streams. A marker after the last-delivered-id is unread;
//     only markers at or before it need a second pipelined round trip (XPENDING or XRANGE
//     of that single id, each O(log n)), so a sweep takes one round trip, or two when some
//     candidate was published by an earlier sweep and is still waiting.
//
// Cost per sweep: 1–2 pipelined Redis round trips for the whole batch (4 EXISTS + 1 GET per
// candidate), plus one script call per published issue; Jira: one search request per page,
// two reads per ymir_todo author check (changelog, groups; cached per user), one label
// write per flip. The script touches the marker and a stream in one call, so the marker
// needs both in one slot: Redis Cluster is not supported for it (the lease keys are).
//
// Errors: a failed search, a Redis failure or a Jira 401 ends the sweep with an error
// (Fatal tells whether an operator must act); any other Jira failure on one issue is
// logged and the issue skipped (ReasonError) until the next sweep.
package fetcher
