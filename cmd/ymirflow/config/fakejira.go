package config

import (
	"flag"
	"net"
	"os"
	"strings"
)

// Defaults of `ymirflow fakejira`.
const (
	DefaultFakeJiraAddr   = "127.0.0.1:8081" // the console has 8080, the webhook 8082
	DefaultFakeJiraIssues = 20
)

// FakeJira is the settings of `ymirflow fakejira`.
type FakeJira struct {
	Addr       string // --addr, ADDR: listen address
	Issues     int    // --issues, ISSUES: generated sample issues (ignored with --issues-file)
	IssuesFile string // --issues-file, ISSUES_FILE: JSON array of issues as Jira's REST API returns them
	Seed       int64  // --seed, SEED: seed of the generated sample issues
	LogLevel   string // --log-level, LOG_LEVEL
	LogFormat  string // --log-format, LOG_FORMAT
	Webhook    string // --webhook, WEBHOOK: URLs that get a signed delivery on every label change and issue creation, comma-separated
	WebhookSecret
}

// Register defines fakejira's flags on fs.
func (f *FakeJira) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Addr, "addr", DefaultFakeJiraAddr, "listen address")
	fs.IntVar(&f.Issues, "issues", DefaultFakeJiraIssues, "generated sample issues (ignored with --issues-file)")
	fs.StringVar(&f.IssuesFile, "issues-file", "", "JSON array of issues shaped as Jira's REST API returns them")
	fs.Int64Var(&f.Seed, "seed", 1, "seed of the generated sample issues")
	registerLogging(fs, &f.LogLevel, &f.LogFormat)
	fs.StringVar(&f.Webhook, "webhook", "", "URLs (comma-separated) that get a signed Jira webhook delivery on every label change and issue creation")
	f.WebhookSecret.register(fs, "secret the webhook deliveries are signed with (X-Hub-Signature)")
}

// Validate checks fakejira's settings.
func (f *FakeJira) Validate() error {
	var p problems
	if _, _, err := net.SplitHostPort(f.Addr); err != nil {
		p.add("addr", "= %q must be host:port or :port", f.Addr)
	}
	if f.Issues < 0 {
		p.add("issues", "= %d must not be negative", f.Issues)
	}
	if f.IssuesFile != "" {
		if _, err := os.Stat(f.IssuesFile); err != nil {
			p.add("issues-file", "= %q cannot be read: %v", f.IssuesFile, unwrapPathErr(err))
		}
	}
	validateLogging(&p, f.LogLevel, f.LogFormat)
	f.validateWebhooks(&p)
	return p.err()
}

// WebhookURLs returns FakeJira's --webhook, split on commas.
func (f *FakeJira) WebhookURLs() []string {
	var out []string
	for _, u := range strings.Split(f.Webhook, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

func (f *FakeJira) validateWebhooks(p *problems) {
	f.WebhookSecret.validate(p)
	for _, raw := range f.WebhookURLs() {
		if msg := httpURLProblem(raw, "http://127.0.0.1:8082/"); msg != "" {
			p.add("webhook", "%s", msg)
		}
	}
}
