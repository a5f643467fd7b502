// Package jira is a small typed client for the parts of the Jira REST API that ymirflow needs:
// JQL search (Jira Cloud's POST /rest/api/3/search/jql with nextPageToken, and Jira Server/DC's
// /rest/api/2/search with startAt/total), reading an issue, editing labels, adding comments,
// reading an issue's changelog, and reading a user's groups.
//
// The entry point is New, which validates Options and names the offending field in its error
// (for example "jira: BaseURL: ..."). A Client is safe for concurrent use. Every request goes through
// one shared rate limiter (Options.RateLimit, 5 requests/s by default, an idle Client sending
// Options.RateBurst of them at once, one second's worth by default), a per-attempt timeout, and
// a retry loop with exponential backoff and jitter on 429 and 5xx that honours Retry-After and
// never sleeps past the caller's context deadline. Options.Shared adds a limit shared with
// other processes (internal/ratelimit's Budget): each attempt waits for it too, and a 429
// pauses it for all of them.
//
// Failures carry the HTTP status in an *HTTPError, which wraps ErrUnauthorized (401),
// ErrForbidden (403), ErrNotFound (404) or ErrRateLimited (429), so both errors.Is and errors.As
// work:
//
//	var he *jira.HTTPError
//	if errors.Is(err, jira.ErrUnauthorized) || errors.As(err, &he) && he.StatusCode == 403 { ... }
//
// With Options.DryRun, or without a BaseURL, writes (labels, comments) are logged and not sent.
//
// Package fakejira (a sub-package) is an in-memory Jira HTTP server for tests and the demo.
package jira
