package config

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
)

// The Jira client takes the token, not its file: JIRA_TOKEN_FILE is read here alone, its
// content trimmed, and that is what the client authenticates with.
func TestJiraTokenFileReachesTheClient(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte("  from-file\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	j := Jira{JiraEmail: "bot@example.com", JiraTokenFile: f}
	token, err := j.Token()
	if err != nil {
		t.Fatal(err)
	}
	srv := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1"}}, Email: "bot@example.com", Token: "from-file"})
	base := srv.Start()
	t.Cleanup(srv.Close)
	c, err := jira.New(jira.Options{BaseURL: base, Email: j.JiraEmail, Token: token, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetIssue(context.Background(), "RHEL-1", nil); err != nil {
		t.Fatalf("GetIssue with token file: %v", err)
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("bot@example.com:from-file"))
	if got := srv.Requests()[0].Authorization; got != want {
		t.Fatalf("Authorization = %q, want basic credentials bot@example.com:from-file", got)
	}
}

// A client asked of a Jira URL without a token is refused naming the settings, as the
// client's own error names only its fields.
func TestJiraClientErrorNamesTheSetting(t *testing.T) {
	t.Parallel()
	j := Jira{JiraURL: "https://jira.example.com"}
	_, err := jira.New(jira.Options{BaseURL: j.JiraURL})
	if !errors.Is(err, jira.ErrTokenRequired) {
		t.Fatalf("jira.New without a token: %v, want ErrTokenRequired", err)
	}
	err = j.ClientError(err)
	if !hasSetting(err, "JIRA_TOKEN", "jira-token") || !strings.Contains(err.Error(), "JIRA_URL (--jira-url)") ||
		!strings.Contains(err.Error(), "JIRA_TOKEN_FILE (--jira-token-file)") {
		t.Fatalf("ClientError = %v, want JIRA_TOKEN (--jira-token) named with JIRA_URL and JIRA_TOKEN_FILE", err)
	}
	other := errors.New("other")
	if got := j.ClientError(other); got != other { //nolint:errorlint // the very error, returned as it is
		t.Fatalf("ClientError(other) = %v", got)
	}
}

// What the client refuses in JIRA_URL, Validate refuses first, naming the setting and
// never the password.
func TestJiraURLCredentialsRefusedRedacted(t *testing.T) {
	// Not parallel: it sets the process environment (clearEnv, t.Setenv), which is one per process: Go refuses t.Setenv in a parallel test.
	clearEnv(t)
	var w Worker
	err := load(t, "worker", &w, demoWorker("--jira-url", "https://bob:s3cret@jira.example.com")...)
	if !hasSetting(err, "JIRA_URL", "jira-url") {
		t.Fatalf("credentials in JIRA_URL: %v", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

// JIRA_RATE's burst defaults to one second's worth, at least 1; JIRA_RATE_BURST sets it.
func TestSharedRateBurst(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rate  string
		burst int
		want  ratelimit.Rate
		set   bool
	}{
		{"", 0, ratelimit.Rate{}, false},
		{"5/s", 0, ratelimit.Rate{N: 5, Per: time.Second, Burst: 5}, true},
		{"300/m", 0, ratelimit.Rate{N: 300, Per: time.Minute, Burst: 5}, true},
		{"30/h", 0, ratelimit.Rate{N: 30, Per: time.Hour, Burst: 1}, true},
		{"5/s", 2, ratelimit.Rate{N: 5, Per: time.Second, Burst: 2}, true},
	} {
		j := Jira{JiraRate: c.rate, JiraRateBurst: c.burst}
		if got, set := j.SharedRate(); got != c.want || set != c.set {
			t.Errorf("JIRA_RATE=%q JIRA_RATE_BURST=%d: %v %v, want %v %v", c.rate, c.burst, got, set, c.want, c.set)
		}
	}
}
