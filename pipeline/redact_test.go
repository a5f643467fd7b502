package pipeline_test

import (
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/pipeline"
)

// redact.URL never returns a password: not in user info, not in ?password=, not in a
// URL that does not parse.
func TestRedactNeverEchoesPasswords(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://u:hunter2@h:6379/0",
		"redis://h:6379/0?password=hunter2",
		"redis://:hunter2@h:6379/0%",
		"redis://u:hunter2@[::1:6379/0",
		"hunter2",
	} {
		if got := redact.URL(raw); strings.Contains(got, "hunter2") {
			t.Errorf("redact.URL(%q) = %q", raw, got)
		}
	}
	if _, err := pipeline.ClientOptions("redis://:hunter2@h:6379/0%"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("ClientOptions error %v", err)
	}
}
