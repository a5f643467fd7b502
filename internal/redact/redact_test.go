package redact_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redact"
)

func TestRedactorSpellings(t *testing.T) {
	t.Parallel()
	secret := `s3cr"et/<p@ss>`
	r := redact.New(secret, "ab", "")
	line, _ := json.Marshal(map[string]string{"stderr": "token is " + secret})
	for _, in := range []string{
		"raw " + secret + " twice " + secret,
		string(line),
		"redis://u:" + url.PathEscape(secret) + "@h?password=" + url.QueryEscape(secret),
	} {
		out := r.String(in)
		if strings.Contains(out, "s3cr") || !strings.Contains(out, redact.Mask) {
			t.Errorf("%q → %q", in, out)
		}
	}
	if got := r.String("ab cd"); got != "ab cd" {
		t.Errorf("a value shorter than MinLen was redacted: %q", got)
	}
	var nilR *redact.Redactor
	if nilR.String("x") != "x" || nilR.Len() != 0 {
		t.Error("nil redactor changed text")
	}
}

func TestRedactorLongestFirst(t *testing.T) {
	t.Parallel()
	r := redact.New("abcd", "abcdefgh")
	if got := r.String("xabcdefghx"); got != "x[redacted]x" {
		t.Fatalf("got %q", got)
	}
}

func TestWriterRedactsLogLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := redact.New("hunter2-hunter2")
	log := zerolog.New(r.Writer(&buf))
	log.Info().Str("stderr", "echo \"hunter2-hunter2\"").Msg("runner said hunter2-hunter2")
	if strings.Contains(buf.String(), "hunter2") || strings.Count(buf.String(), redact.Mask) != 2 {
		t.Fatalf("log line: %s", buf.String())
	}
	r.Add("rotated-token")
	buf.Reset()
	log.Info().Msg("rotated-token")
	if strings.Contains(buf.String(), "rotated") {
		t.Fatalf("added secret not redacted: %s", buf.String())
	}
}

func TestSecretName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{"GITLAB_TOKEN": true, "db_password": true, "AWS_SECRET_ACCESS_KEY": true,
		"ANTHROPIC_API_KEY": true, "GOOGLE_APPLICATION_CREDENTIALS": true, "PATH": false, "HOME": false, "JIRA_ISSUE": false} {
		if redact.SecretName(name) != want {
			t.Errorf("SecretName(%q) = %v", name, !want)
		}
	}
}

func Example() {
	r := redact.New("hunter2-pass")
	fmt.Println(r.String("AUTH default hunter2-pass"))
	// Output: AUTH default [redacted]
}

func TestURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://u:hunter2@h:6379/0":                "redis://u:xxxxx@h:6379/0",
		"redis://h:6379/0?password=hunter2&db=3":    "redis://h:6379/0?db=3&password=xxxxx",
		"redis://:hunter2@h:6379%zz":                "<unparseable URL>",
		"redis://h/0?pass=hunter2&auth=hunter2&x=1": "redis://h/0?auth=xxxxx&pass=xxxxx&x=1",
		"redis:hunter2@h":                           "<unparseable URL>",
		"redis://h/0?%zz=hunter2":                   "redis://h/0?xxxxx",
		"https://jira.example.com":                  "https://jira.example.com",
		"hunter2":                                   "<unparseable URL>",
	} {
		if got := redact.URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}
