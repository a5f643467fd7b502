package fakejira_test

import (
	"slices"
	"testing"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

func TestSampleIssue(t *testing.T) {
	t.Parallel()
	for _, k := range fakejira.SampleKinds {
		a := fakejira.SampleIssue(k, 77, 3)
		b := fakejira.SampleIssue(k, 77, 3)
		if a.Key != "RHEL-77" || fakejira.SampleKindOf(a) != k {
			t.Errorf("%s: key %s kind %s", k, a.Key, fakejira.SampleKindOf(a))
		}
		if a.Summary != b.Summary || !slices.Equal(a.Labels, b.Labels) || !slices.Equal(a.FixVersions, b.FixVersions) {
			t.Errorf("%s: two calls with the same seed differ", k)
		}
	}
	if got := fakejira.SampleIssue(fakejira.SampleTodo, 5, 1).Labels; !slices.Equal(got, []string{"ymir_todo"}) {
		t.Errorf("todo sample labels = %v", got)
	}
}
