package lockmw

import "errors"

// ErrNoIssueKey: the default Config.IssueKey found no MetaIssueKey metadata.
var ErrNoIssueKey = errors.New("lockmw: event has no issue key")
