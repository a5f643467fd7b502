package integration

import "testing"

func TestTmpIssueLineCluster(t *testing.T) { waitIssueLineUnderKills(t, true) }
