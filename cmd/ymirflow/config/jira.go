package config

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/ratelimit"
	"github.com/ymirflow/ymirflow/internal/redact"
)

// Defaults of the Jira settings; the client's own are referenced, not re-declared.
const (
	DefaultJiraAPI        = "auto"
	DefaultJiraTimeout    = jira.DefaultTimeout
	DefaultJiraMaxRetries = jira.DefaultMaxRetries
	DefaultJiraRateLimit  = jira.DefaultRateLimit
	DefaultJQL            = "project = RHEL AND assignee = jotnar-project"
	DefaultTriggerGroup   = "Red Hat Employee"
)

// Jira is the settings of the Jira client, embedded by the commands that
// read or write Jira.
type Jira struct {
	JiraURL          string        // --jira-url, JIRA_URL: base URL; empty: Jira writes are logged, not sent
	JiraEmail        string        // --jira-email, JIRA_EMAIL: account e-mail for Jira Cloud basic auth
	JiraToken        string        // --jira-token, JIRA_TOKEN: API token (Cloud) or personal access token (Server/DC)
	JiraTokenFile    string        // --jira-token-file, JIRA_TOKEN_FILE: file holding the token (read by Token)
	JiraJQL          string        // --jira-jql, JIRA_JQL: the fetcher's search
	JiraTriggerGroup string        // --jira-trigger-group, JIRA_TRIGGER_GROUP: group whose members may add ymir_todo (empty: anyone)
	JiraAPI          string        // --jira-api, JIRA_API: cloud|server|auto (auto: cloud for *.atlassian.net)
	JiraCommentGroup string        // --jira-comment-group, JIRA_COMMENT_GROUP: group that comments are restricted to (empty: visible to all)
	JiraTimeout      time.Duration // --jira-timeout, JIRA_TIMEOUT: bound of one HTTP attempt
	JiraMaxRetries   int           // --jira-max-retries, JIRA_MAX_RETRIES: retries after a 429, 5xx or network error (negative: none)
	JiraRateLimit    float64       // --jira-rate-limit, JIRA_RATE_LIMIT: requests per second (negative: no limit)
	JiraRate         string        // --jira-rate, JIRA_RATE: requests per period shared by every process through Redis, e.g. 5/s (empty: none)
	JiraRateBurst    int           // --jira-rate-burst, JIRA_RATE_BURST: requests JIRA_RATE lets go at once after a quiet spell (0: one second's worth)
	DryRun           bool          // --dry-run, DRY_RUN: log Jira writes instead of sending them
}

// Register defines the Jira flags on fs.
func (j *Jira) Register(fs *flag.FlagSet) {
	fs.StringVar(&j.JiraURL, "jira-url", "", "Jira base URL, e.g. https://example.atlassian.net/ (empty: Jira writes are logged, not sent)")
	fs.StringVar(&j.JiraEmail, "jira-email", "", "account e-mail for Jira Cloud basic authentication")
	fs.StringVar(&j.JiraToken, "jira-token", "", "Jira API token (Cloud) or personal access token (Server/DC); prefer --jira-token-file")
	fs.StringVar(&j.JiraTokenFile, "jira-token-file", "", "file that holds the Jira token, read once at start-up: restart the process after rotating it")
	fs.StringVar(&j.JiraJQL, "jira-jql", DefaultJQL, "JQL of the fetcher's search")
	fs.StringVar(&j.JiraTriggerGroup, "jira-trigger-group", DefaultTriggerGroup, "Jira group whose members may trigger work with ymir_todo (empty: anyone)")
	fs.StringVar(&j.JiraAPI, "jira-api", DefaultJiraAPI, "Jira REST flavour: cloud (/rest/api/3), server (/rest/api/2) or auto")
	fs.StringVar(&j.JiraCommentGroup, "jira-comment-group", "", "Jira group that the pipeline's comments are restricted to (empty: visible to all)")
	fs.DurationVar(&j.JiraTimeout, "jira-timeout", DefaultJiraTimeout, "bound of one Jira HTTP attempt"+rangeHelp("jira-timeout"))
	fs.IntVar(&j.JiraMaxRetries, "jira-max-retries", DefaultJiraMaxRetries, "retries of a Jira request after a 429, a 5xx or a network error (negative: none)")
	fs.Float64Var(&j.JiraRateLimit, "jira-rate-limit", DefaultJiraRateLimit, "Jira requests per second, all requests of the process together (negative: no limit)")
	fs.StringVar(&j.JiraRate, "jira-rate", "", "Jira requests per period shared by every ymirflow process through Redis, e.g. 5/s or 300/m; a 429 pauses all (empty: none)")
	fs.IntVar(&j.JiraRateBurst, "jira-rate-burst", 0, "requests JIRA_RATE lets go at once after a quiet spell (0: one second's worth, at least 1)")
	fs.BoolVar(&j.DryRun, "dry-run", false, "log Jira writes instead of sending them")
}

// SharedRate is JIRA_RATE with its burst, and whether it is set. Validate has checked it.
func (j *Jira) SharedRate() (ratelimit.Rate, bool) {
	if strings.TrimSpace(j.JiraRate) == "" {
		return ratelimit.Rate{}, false
	}
	r, err := ratelimit.ParseRate(j.JiraRate)
	if err != nil {
		return ratelimit.Rate{}, false
	}
	r.Burst = j.JiraRateBurst
	if r.Burst == 0 {
		// One second's worth, as the per-process limit's default burst.
		r.Burst = max(1, int(math.Ceil(float64(r.N)*float64(time.Second)/float64(r.Per))))
	}
	return r, true
}

// APIFlavour is JiraAPI as internal/jira's Options.API takes it: "cloud",
// "server", or "" for auto.
func (j *Jira) APIFlavour() string {
	if j.JiraAPI == "auto" {
		return ""
	}
	return j.JiraAPI
}

// Validate checks the Jira settings.
func (j *Jira) Validate() error {
	var p problems
	j.validate(&p)
	return p.err()
}

func (j *Jira) validate(p *problems) {
	if j.JiraURL != "" {
		if msg := httpURLProblem(j.JiraURL, "https://example.atlassian.net/"); msg != "" {
			p.add("jira-url", "%s", msg)
		} else if msg := jiraURLProblem(j.JiraURL); msg != "" {
			p.add("jira-url", "%s", msg)
		}
	}
	if !oneOf(j.JiraAPI, "cloud", "server", "auto") {
		p.add("jira-api", "= %q must be cloud, server or auto", j.JiraAPI)
	}
	checkRange(p, "jira-timeout", j.JiraTimeout)
	switch {
	case j.JiraRateLimit == 0:
		p.add("jira-rate-limit", "= 0 would block every request (negative: no limit)")
	case math.IsNaN(j.JiraRateLimit) || math.IsInf(j.JiraRateLimit, 0):
		p.add("jira-rate-limit", "= %v must be a finite number of requests per second (negative: no limit)", j.JiraRateLimit)
	}
	checkSharedRate(p, "jira-rate", "jira-rate-burst", j.JiraRate, j.JiraRateBurst)
	if j.JiraToken != "" && j.JiraTokenFile != "" {
		p.add("jira-token-file", "and JIRA_TOKEN (--jira-token) are both set; set one")
	}
	if j.JiraTokenFile != "" {
		token, err := ReadSecretFile(j.JiraTokenFile)
		switch {
		case err != nil:
			p.add("jira-token-file", "= %q cannot be read: %v", j.JiraTokenFile, err)
		case token == "":
			p.add("jira-token-file", "= %q is empty", j.JiraTokenFile)
		}
	}
	hasToken := j.JiraToken != "" || j.JiraTokenFile != ""
	if j.JiraEmail != "" && !hasToken {
		p.add("jira-email", "is set but neither JIRA_TOKEN (--jira-token) nor JIRA_TOKEN_FILE (--jira-token-file) is")
	}
	if j.JiraAPI == "cloud" && hasToken && j.JiraEmail == "" {
		p.add("jira-email", "is required with JIRA_API=cloud: Jira Cloud authenticates with e-mail and API token")
	}
}

// checkSharedRate checks a shared rate setting (N/UNIT, empty: none) and its burst.
func checkSharedRate(p *problems, rateFlag, burstFlag, rate string, burst int) {
	if burst < 0 {
		p.add(burstFlag, "= %d must not be negative (0: the default)", burst)
	}
	if strings.TrimSpace(rate) == "" {
		return
	}
	r, err := ratelimit.ParseRate(rate)
	if err != nil {
		p.add(rateFlag, "= %q: %s (empty: no shared limit)", rate, strings.TrimPrefix(err.Error(), ratelimit.ErrBadRate.Error()+": "))
		return
	}
	if burst > 0 {
		r.Burst = burst
		if err := r.Check(); err != nil {
			p.add(burstFlag, "= %d: %s", burst, strings.TrimPrefix(err.Error(), ratelimit.ErrBadRate.Error()+": "))
		}
	}
}

// Token returns the Jira token: JiraToken, or the trimmed content of
// JiraTokenFile, read now. Both empty yields "" (anonymous).
func (j *Jira) Token() (string, error) {
	if j.JiraToken != "" || j.JiraTokenFile == "" {
		return j.JiraToken, nil
	}
	token, err := ReadSecretFile(j.JiraTokenFile)
	if err != nil {
		return "", &SettingError{Env: "JIRA_TOKEN_FILE", Flag: "jira-token-file",
			Msg: fmt.Sprintf("= %q cannot be read: %v", j.JiraTokenFile, err)}
	}
	return token, nil
}

// jiraURLProblem is what the Jira client refuses in a base URL that is a valid http(s)
// URL ("" when nothing): credentials in it, a query or a fragment.
func jiraURLProblem(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	switch {
	case err != nil:
		return ""
	case u.User != nil:
		return fmt.Sprintf("= %q must not carry credentials: set JIRA_EMAIL (--jira-email) and JIRA_TOKEN_FILE (--jira-token-file)", redact.URL(raw))
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Sprintf("= %q must not have a query or fragment, e.g. https://example.atlassian.net/", redact.URL(raw))
	}
	return ""
}

// ClientError names the setting at fault in an error of jira.New on these settings, for
// what Validate leaves to the commands that build a client: a token, which only they
// need. Other errors are returned as they are (Validate refuses what they would say).
func (j *Jira) ClientError(err error) error {
	if errors.Is(err, jira.ErrTokenRequired) {
		return &SettingError{Env: "JIRA_TOKEN", Flag: "jira-token",
			Msg: "is required when JIRA_URL (--jira-url) is set (or JIRA_TOKEN_FILE (--jira-token-file))"}
	}
	return err
}
