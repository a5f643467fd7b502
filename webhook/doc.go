// Package webhook receives Jira webhooks and publishes triage requests through the
// fetcher's own classification, so that a maintainer's ymir_todo starts triage within a
// second instead of at the next sweep. The sweep stays as the safety net: both sources go
// through fetcher.(*Fetcher).Process, one code path, and the fetcher's idempotent publish
// makes a webhook and a sweep racing on an issue publish it once.
//
// The entry point is New; a Receiver is an http.Handler. Per delivery, in order:
//
//   - only POST (405), Content-Type application/json (415), a body of at most
//     Config.MaxBody, 1 MiB by default (413);
//   - the signature of Jira's admin webhooks: X-Hub-Signature: sha256=<hex HMAC-SHA256 of
//     the raw body keyed with the secret>, compared in constant time; missing, another
//     algorithm, not hex, or wrong: 401, counted. With no secret New refuses
//     (ErrNoSecret) unless InsecureNoSignature;
//   - a JSON object with webhookEvent, and an issue key for issue and comment events (400);
//   - X-Atlassian-Webhook-Identifier, the same on Jira's retries of one delivery: a
//     delivery already handled is answered 202 "duplicate". The id is remembered in Redis
//     (DeliveryKey, 24h) only once the delivery is handled, so a delivery answered 503 is
//     taken again on its retry;
//   - events caused by ymirflow's own Jira account (its label flips) are ignored, counted;
//   - jira:issue_created and jira:issue_updated: when Config.JQL is set, one search
//     "key = K AND (JQL)" keeps out issues the sweep would never look at (a registration
//     without a JQL filter must not start work elsewhere); then the payload's issue is used
//     when it carries every field the rules read and the event is recent
//     (Config.MaxPayloadAge); otherwise (a retry, or a thin payload) the issue is read from
//     Jira. A changelog that adds ymir_todo names who added it, sparing the changelog read
//     of the trigger-group check. fetcher.Process then classifies, pre-checks leases
//     (a locked issue keeps its trigger label and is published by the sweep after the
//     release), publishes idempotently and flips the label;
//   - comment_created: recorded in CommentsStream for later use.
//
// Answers: 202 once the request is in its stream, or the delivery is known to need
// nothing (duplicate, own account, out of scope, skipped by a rule); 503 when Redis or Jira
// failed, or the work did not end within Config.Deadline (900ms by default), so that Jira
// retries. Nothing is acknowledged before it is safely in a stream. Every answer is counted
// in Metrics by status and outcome.
package webhook
