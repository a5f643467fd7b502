// Package agentctl is the agent's control channel: what a running agent asks ymirflow
// for, beside its mailbox, and what ymirflow keeps of it in Redis.
//
// A run's Channel reads NDJSON requests from the agent (one JSON object a line, at most
// MaxLine bytes, at most Limits.Rate a second) and answers each with one line. The ops:
//
//   - usage: what a call cost (model, tokens in and out, cost, tool calls), counted once
//     per (run, seq) in the Ledger, across every run and agent of the issue;
//   - reserve: an amount asked before an expensive call, granted or denied against the
//     issue's budget and the agent's (Budgets; 0 is off). A reservation lives while its
//     run holds its lease and is settled by the run's next usage report;
//   - checkpoint: bounded JSON progress, saved under the lease's fence; the next run of
//     the issue finds it in its Task JSON ("checkpoint");
//   - permit: one call to a named upstream (jira, gitlab, llm:<model>), limited by rate
//     for every pod at once (Permits); throttled reports a 429 and its Retry-After;
//   - progress: the agent is working (ChannelOptions.ProgressTimeout: a run quiet that
//     long gives its lease up, WatchProgress).
//
// A run denied for its budget parks its request (Park) and asks once per budget level
// for more (BeginAsk, Asked); an approval raises the budget (Raise) and publishes the
// parked requests again, each forgotten only after its idempotent publish
// (ResumeParked).
//
// Every request is checked against the run's lease in the same Redis script that acts
// on it: a run that no longer holds its lease (superseded, lost, expired) is refused
// with "stale_fence", whatever it asks. Spend therefore never exceeds the budget plus
// one reservation: a granted amount is counted against the budget from the grant until
// the usage report replaces it, or until the run's lease is gone.
//
// The agent is untrusted: it never sees Redis, a credential or another issue; every
// field it sends is validated and bounded, and a run that floods the channel is
// answered "rate_limited" and then disconnected.
//
// The scripts read the lease's lock and info keys (lockmw/lease, Keys) and the ledger's
// keys in one script, so the ledger needs the lease's compat key layout (one Redis, or
// Sentinel), not Redis Cluster.
package agentctl
