// Package fetcher sweeps Jira for issues that need triage and publishes one triage request
// per issue to the pipeline's triage streams. It is the Go successor of the Python ymir
// jira_issue_fetcher, with the differences listed in docs/architecture.md, "The fetcher's
// rules".
//
// The entry point is New; (*Fetcher).Sweep runs one sweep and returns a Summary (found,
// published, skipped by reason, one Outcome per issue). (*Fetcher).Process runs passes 1–3
// below on issues that came from elsewhere (package webhook hands it the issue of a Jira
// webhook): one code path for both sources, so a webhook and a sweep racing on the same
// issue still publish it once. A sweep has three passes:
//
//  1. Search and classify, no I/O besides the search. JIRA_JQL goes through internal/jira's
//     SearchAll (Jira Cloud's POST /rest/api/3/search/jql paged by nextPageToken, Server/DC's
//     /rest/api/2/search paged by startAt; at most 5 requests/s; 429 and 5xx retried, with
//     Retry-After), asking only for the fields the rules read: labels, updated, status,
//     components, fixVersions and the downstream component field (customfield_10669). Keys
//     are canonicalised with the Locker. Then upstream rules A–D: no ymir_* label →
//     publish; ymir_todo without an in-progress label → user-triggered (A); a stale
//     in-flight label (STALE_LABEL_THRESHOLD, default 24h, on the updated time;
//     Jira's +0000 offsets and naive timestamps, read as UTC) → recovered (B); other ymir_*
//     labels → skipped (C); ymir_retry_needed without an in-progress label → retried (D). A
//     modular package (component like perl:5.32/perl) is skipped, and its ymir_todo removed
//     rather than re-checked every sweep. Before the rules, an issue parked for its
//     agents' budget (ymir_budget_exhausted) is skipped as labelled whatever trigger it
//     carries: only a maintainer's budget approval (package webhook) resumes it.
//  2. Pre-check the whole batch in ONE pipelined round trip, never a SCAN (upstream SCANned
//     the keyspace for triage leases only, from a snapshot taken before the sweep): the lease key of every stage
//     (triage, rebase, backport, rebuild; names from lease.Locker.LockKey(agent, issue))
//     of every candidate, and its queued marker (below), as point lookups. They are sent as
//     MGETs of up to 1 024 keys in one pipeline: an EXISTS that also says which stage
//     holds the lease, and measured 4× cheaper than one EXISTS per key. A locked issue is
//     left exactly as it is, trigger label included, and nothing is published; the first
//     sweep after the release takes it (the review finding "locked skip strands trigger
//     labels", without upstream's flip-and-drop, which could strand an issue for good).
//  3. Act, per candidate in Jira's order: MAX_ISSUES (skips do not count); for ymir_todo the
//     check that whoever added it last (newest add in the paginated changelog) is in
//     JIRA_TRIGGER_GROUP, a non-member's ymir_todo being removed; then PUBLISH, then FLIP
//     the trigger to ymir_triage_in_progress (a stale label goes through ymir_retry_needed
//     first, as upstream). No label is flipped without its publish: if the publish fails,
//     nothing is written to Jira and the sweep stops; if the flip fails, the request is out
//     and the queued marker keeps the next sweep from publishing it again. DRY_RUN (or a
//     dry-run Jira client) writes nothing to Jira and still publishes. After a sweep that
//     published, the triage streams are trimmed towards MaxLen with event.Trim, which
//     never cuts an entry a group still needs.
//
// # Idempotent publish
//
// An issue whose triage request still waits in a triage stream (published, not yet acked)
// is not published again; this replaces upstream's LRANGE of 26 lists per sweep (lists
// that never shrank, and that ymir_todo bypassed). It is decided in Redis, O(1) per issue, with a marker key per issue,
// "<ns>:queued:triage:<KEY>" (event.Topology.Queued), holding "<entry id> <stream>
// <message UUID>". The UUID is there because an id alone does not name an entry for good:
// a stream deleted and created again restarts its ids, and its first entry takes the id
// of an old entry published in the same millisecond.
//
//   - Every publish is one Lua script: unless the marker names an entry still waiting, XADD
//     the request (event.Encode, so entries are what event.Publisher writes) and point
//     the marker at it with a TTL (Config.QueuedTTL, default 24h). Check and append are
//     atomic, so sweeps racing from two processes (the daily and the todo CronJob) still
//     publish once. event.Publisher cannot take part in a script, hence the own XADD.
//   - "Waiting" is read from the stream itself, so no cooperation from the triage handler is
//     needed: the entry is after the triage group's last-delivered-id and still in the
//     stream with the marker's UUID (unread; a missing group counts as unread, workers
//     create it from id 0), or XPENDING finds exactly that id (delivered, not acked) and
//     the entry, if still there, has the marker's UUID. Once the entry is acked (done,
//     dropped or dead-lettered) the marker is stale and the issue may be published again,
//     whatever its TTL. The TTL only bounds garbage; each sweep that finds a marker renews
//     it, so a backlog older than the TTL is not published twice.
//   - The pre-check reads the markers in the lease round trip, with each triage stream's
//     group's last-delivered-id (XINFO GROUPS). A second pipelined round trip is made only
//     when some candidate has a marker: it renews the TTLs, reads the entry each marker
//     names (XRANGE id id) and, for an entry already delivered, asks XPENDING about that
//     one id.
//   - A producer of downstream requests may write the same kind of marker (with or
//     without the UUID; without it, any entry at the id counts as the marker's) under
//     topology.Queued(agent, issue); for stale in-flight issues the pre-check reads those
//     too, and leaves alone an issue whose downstream request still waits (upstream's "still
//     queued" of rule B).
//
// Costs per sweep: Jira: one search request per page, two reads per ymir_todo author check
// (changelog, groups; groups cached per user for the sweep, and a member remembered for
// Config.MemberTTL, 1 minute, across sweeps and webhook deliveries), one label write per
// flip.
// Redis: one pipelined round trip for the pre-check (two when some candidate was
// published before and is a candidate again), one script call per published issue, and a
// trim. The script touches the marker and a stream in one call (and the index of
// the stream, xonce.IndexKey), so on Redis Cluster each triage stream has its own marker in
// its slot (event.Topology.QueuedBeside: "{<stream>}:queued:triage:<KEY>") and the
// pre-check reads both; its lookups there are one GET each instead of MGETs, which go-redis
// pipelines as one round trip per node, all nodes at once. On standalone Redis nothing
// changes (one marker, Topology.Queued). What Cluster gives up: two processes publishing
// one issue to the two triage streams at the same moment can both succeed (each script
// sees only its own stream's marker); the lease still runs the two one after the other.
//
// Errors: a failed search, a Redis failure (ErrRedis) or a Jira 401 ends the sweep with an
// error, Fatal telling whether an operator must act (401, or 403 on the search); any
// other Jira failure on one issue is logged and the issue skipped (ReasonError) until the
// next sweep.
package fetcher
