package jira_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

func ExampleClient_Search() {
	srv := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{
		{Key: "RHEL-1", Labels: []string{"ymir_todo"}, Status: "New"},
		{Key: "RHEL-2", Status: "In Progress"},
		{Key: "RHEL-3", Labels: []string{"ymir_triaged_backport"}, Status: "New"},
	}})
	defer srv.Close()

	c, err := jira.New(jira.Options{BaseURL: srv.Start(), API: jira.APICloud, Token: "secret", Email: "bot@example.com"})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	req := jira.SearchRequest{JQL: `project = RHEL AND labels = "ymir_todo"`, Fields: []string{"labels", "status"}, MaxResults: 2}
	for {
		page, err := c.Search(ctx, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, is := range page.Issues {
			fmt.Println(is.Key, is.Fields.Status.Name, is.Fields.Labels)
		}
		if page.IsLast {
			break
		}
		req.PageToken = page.NextPageToken
	}
	// Output:
	// RHEL-1 New [ymir_todo]
	// RHEL-2 In Progress []
	// RHEL-3 New [ymir_triaged_backport]
}
