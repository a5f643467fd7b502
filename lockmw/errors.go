package lockmw

import "errors"

// ErrNoIssueKey is returned by the default Config.IssueKey for a message without
// event.MetaIssueKey metadata.
var ErrNoIssueKey = errors.New("lockmw: event has no issue key")
