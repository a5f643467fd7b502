// Package handlers holds ymirflow's agent stages: one Watermill handler per agent
// (triage, rebase, backport, rebuild) with the Jira label state machine of the Python
// ymir agents, and the routing table from a triage resolution to a downstream stream.
// The agents' actual work is a runners.Runner (package runners: the exec runner).
//
// The entry point is New: it returns the handler that pipeline.RouterConfig.Handler
// takes. The router wraps it in the per-issue lease (lockmw), retries and dead letters.
//
// Triage, for one event:
//
//  1. Agent-side dedup: an issue with a terminal ymir label and no trigger
//     (ymir_retry_needed, ymir_triage_in_progress, a user-triggered run) is skipped;
//     a Closed or Done issue is skipped, its claim and (user-triggered) ymir_todo removed.
//  2. Claim: one label write adds ymir_triage_in_progress and removes every other ymir_*
//     label.
//  3. The runner triages.
//  4. The resolution label (ResolutionLabel) replaces the claim. For rebase, backport and
//     rebuild with a target branch it is three steps: the label is added, the
//     downstream Task is published, fenced, to <agent>:<c9s|c10s>[:todo] (Dispatch),
//     and only then is the claim removed. Upstream labels first and publishes after,
//     so a crash in between leaves a labelled issue that nothing picks up again; here
//     the claim is still on the issue until the request is out, so the redelivery
//     triages again. Adding the label before publishing keeps a fast downstream agent
//     (which removes ymir_triaged_<agent> when done) from finishing before it is added.
//  5. A stage.done record goes to the results stream.
//
// Rebase, backport and rebuild run the runner; success writes ymir_<agent>ed (removing
// the triaged, failed and errored labels); a failure is retried by the pipeline, with
// ymir_<agent>_failed for user-triggered runs, and the last attempt writes
// ymir_<agent>_errored, removes ymir_triaged_<agent> and records stage.failed before the
// pipeline dead-letters the event. ymir_triaged_<agent> stays until then: it is the
// issue's in-flight marker.
//
// What an event's attempts already did (a runner result, the publish, a label) is
// remembered in memory for its retries, so a Jira or Redis failure after the agent ran
// never runs the agent again nor publishes twice; that includes the records of the
// run's follow-ups, written before they leave the mailbox. An event's terminal record
// is written once per stream entry (Results.AddOnce) and read at every delivery: an
// event whose ack failed is settled from it, on whichever worker it reaches, without a
// run (docs/architecture.md, "One outcome per event"). A Jira outage (429, 5xx, network,
// 401/403) is retried with backoff by the Jira client and by the pipeline; if it
// outlasts the event's attempts the event is left pending and redelivered (the error
// matches redeliver.ErrTransient) instead of being dead-lettered. A cancelled context
// (lease lost, shutdown) is never a failure: nothing is labelled and the pipeline
// redelivers.
//
// Every side effect made for an event is fenced by its lease. Publishes and outcome
// records are one Redis script with the lease check. A Jira write (labels, comment) is
// sent only after Lease.Check proved the lease in the same step, and is refused with
// lease.ErrLeaseLost otherwise ("fenced write refused", counted by the FenceObserver).
// Jira has no conditional write, so a pause between the check and the request can still
// let a write land after the lease passed to a newer holder. Two things make such a write
// converge: every terminal label write asserts the whole state (it removes the
// other state labels, see otherState), so the stale label does not survive the newer
// holder's next write; and the writer proves its lease again after Jira answered, and if
// it is gone, re-asserts the labels implied by the last recorded outcome in the
// results stream once no holder of the issue is live ("fenced write raced").
package handlers
