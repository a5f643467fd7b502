package fakejira_test

import (
	"context"
	"slices"
	"testing"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

func TestSampleIssues(t *testing.T) {
	t.Parallel()
	a := fakejira.SampleIssues(40, 7)
	b := fakejira.SampleIssues(40, 7)
	if len(a) != 40 {
		t.Fatalf("got %d issues", len(a))
	}
	seen := map[fakejira.SampleKind]int{}
	for i := range a {
		if a[i].Key != b[i].Key || fakejira.SampleKindOf(a[i]) != fakejira.SampleKindOf(b[i]) || !slices.Equal(a[i].Labels, b[i].Labels) {
			t.Errorf("issue %d differs between two calls with the same seed", i)
		}
		k := fakejira.SampleKindOf(a[i])
		if k == "" {
			t.Errorf("%s: no kind in summary %q", a[i].Key, a[i].Summary)
		}
		seen[k]++
	}
	for i, k := range fakejira.SampleKinds {
		if seen[k] == 0 {
			t.Errorf("kind %s missing", k)
		}
		if got := fakejira.SampleKindOf(a[i]); got != k {
			t.Errorf("issue %d is %s, want %s first", i, got, k)
		}
	}
	if fakejira.SampleIssues(0, 1) != nil {
		t.Error("SampleIssues(0) is not empty")
	}

	// The maintainer's ymir_todo resolves to a member of the trigger group through the API.
	srv := fakejira.New(fakejira.Options{Issues: a, Groups: fakejira.SampleGroups()})
	url := srv.Start()
	defer srv.Close()
	c, err := jira.New(jira.Options{BaseURL: url, Token: "x", RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, is := range a[:len(fakejira.SampleKinds)] {
		if !slices.Contains(is.Labels, "ymir_todo") {
			continue
		}
		u, _, found, err := c.LastLabelAdder(ctx, is.Key, "ymir_todo")
		if err != nil || !found {
			t.Fatalf("%s: adder: %v %v", is.Key, found, err)
		}
		groups, err := c.UserGroups(ctx, u.ID())
		if err != nil {
			t.Fatal(err)
		}
		member := slices.Contains(groups, fakejira.SampleTriggerGroup)
		if want := fakejira.SampleKindOf(is) != fakejira.SampleTodoOutsider; member != want {
			t.Errorf("%s (%s): adder %s member=%v", is.Key, fakejira.SampleKindOf(is), u.ID(), member)
		}
	}
}
