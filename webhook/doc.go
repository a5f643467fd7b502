// Package webhook receives Jira webhooks and publishes triage requests through the
// fetcher's own classification, so that a maintainer's ymir_todo starts triage within a
// second instead of at the next sweep. The sweep stays as the safety net: both sources go
// through fetcher.(*Fetcher).Process, one code path, and the fetcher's idempotent publish
// makes a webhook and a sweep racing on an issue publish it once.
//
// The entry point is New; a Receiver is an http.Handler, and Run classifies what it
// stored. A delivery is made durable first and classified after, so that Jira's answer
// never waits for Jira itself (JIRA_RATE_LIMIT, JIRA_RATE, slow searches): ServeHTTP checks, in order,
//
//   - only POST (405), Content-Type application/json (415), a body of at most
//     Config.MaxBody, 1 MiB by default (413);
//   - the signature of Jira's admin webhooks: X-Hub-Signature: sha256=<hex HMAC-SHA256 of
//     the raw body keyed with the secret>, compared in constant time; missing, another
//     algorithm, not hex, or wrong: 401, counted. With no secret New refuses
//     (ErrNoSecret) unless InsecureNoSignature;
//   - a JSON object with webhookEvent, and an issue key for issue and comment events (400);
//   - X-Atlassian-Webhook-Identifier, the same on Jira's retries of one delivery: a
//     delivery already handled is answered 202 "duplicate" (DeliveryKey, 24h);
//
// then appends the raw delivery to the inbox (InboxStream, one XADD) and answers 202
// "queued": two Redis round trips, no Jira call. Redis failing or slower than
// Config.Deadline (900ms) gets 503, and Jira retries.
//
// Run reads the inbox through the consumer group InboxGroup, one delivery at a time in
// order, and classifies it as the receiver used to before answering:
//
//   - a delivery id already handled (Jira retried while the first copy waited) is a
//     duplicate;
//   - events caused by ymirflow's own Jira account (its label flips) are ignored, counted;
//   - jira:issue_created and jira:issue_updated. Each Jira call before the publish waits
//     its turn under JIRA_RATE_LIMIT (and JIRA_RATE, shared with every process), so
//     there are few: for a maintainer's ymir_todo,
//     one (two the first time in a minute: the group read). A fresh payload
//     (Config.MaxPayloadAge) with its labels is used as it is, and a changelog that adds
//     ymir_todo names who added it (no changelog read). When the rules act on nothing in
//     it, no Jira call is made. Otherwise, with Config.JQL set, one search
//     "key = K AND (JQL)" keeps out issues the sweep would never look at (a registration
//     without a JQL filter must not start work elsewhere) and brings the fields the
//     payload lacks; without a JQL, only those fields are read. A retry, or a payload
//     without labels, is replaced by the issue as Jira has it now, read by that one
//     search (or GET issue). The scope check and the trigger-group check gate the
//     publish (they decide whether anything may start), so they stay before it; the
//     group check costs no call for a member seen within fetcher.Config.MemberTTL.
//     fetcher.Process then classifies, pre-checks leases (a locked issue keeps its
//     trigger label and is published by the sweep after the release), publishes
//     idempotently and flips the label;
//   - comment_created (handleComment): when a stage's run holds the lease, the
//     comment becomes a follow-up of that run: a comment.created event (event.CommentCreated)
//     on the twin of the stream of the entry the run works on (:todo for the main
//     stream, the main stream for :todo: its own subscription reads it while the run
//     lasts), with the run's Task as payload and its correlation id, and in metadata
//     the comment's Jira id, author and text. The text has ymirflow's secrets
//     (Config.Redactor) and anything credential-shaped (redact.Tokens) masked, and is
//     cut to Config.CommentMaxBytes. It is published once per comment id and stream
//     (a redelivery under another delivery id adds nothing). The worker's busy policy
//     decides its fate: deliver puts it in the run's mailbox, which the agent reads on
//     YMIR_MAILBOX. A comment on an issue no run holds starts nothing (comment_no_run);
//     comments by Config.OwnAccounts (the agents' own reports) are never published.
//     A comment_created without comment.id is malformed (400). A comment approving more
//     budget ("/ymir budget +N", agentctl.ParseApproval) is not a follow-up
//     (handleApproval): from a member of the fetcher's trigger group (none set: nobody),
//     it raises the budget by N USD once per comment id and publishes again the
//     requests parked for the budget (budget_raised); from anyone else it does nothing
//     (approval_untrusted). With Config.ApprovalLabelUSD set, ymir_budget_approved
//     added to an issue is an approval of that amount, once per changelog id, by the
//     same rule; the receiver then removes the label, for the next approval.
//
// A classified delivery is counted, logged, then acked and deleted from the inbox (an empty
// inbox means every delivery is accounted for) and its id remembered; one
// whose classification failed (Redis or Jira unavailable, Config.ProcessTimeout) stays
// pending and is taken again after Config.RetryAfter by this or another replica, at most
// Config.MaxAttempts times (then logged and counted as gave_up; the sweep still sees the
// issue). A receiver killed mid-classification leaves its entry pending for the next one:
// nothing answered 202 is lost. Answers are counted in Metrics by status and outcome,
// classifications by the status they would have been answered with and outcome.
package webhook
