package jira_test

import (
	"context"
	"testing"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

func TestComments(t *testing.T) {
	t.Parallel()
	_, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{})
	ctx := context.Background()
	if cs, err := c.Comments(ctx, "RHEL-1"); err != nil || len(cs) != 0 {
		t.Fatalf("no comments yet: %+v, %v", cs, err)
	}
	for _, b := range []string{"first", "second"} {
		if err := c.AddComment(ctx, "RHEL-1", b); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := c.Comments(ctx, "RHEL-1")
	if err != nil || len(cs) != 2 || cs[0].Body != "first" || cs[1].Body != "second" || cs[0].ID == "" {
		t.Fatalf("comments = %+v, %v", cs, err)
	}
	if _, err := c.Comments(ctx, "../x"); err == nil {
		t.Fatal("bad key accepted")
	}
}
