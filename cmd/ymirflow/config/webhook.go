package config

import (
	"flag"
	"net"
	"strings"
	"time"
)

// Defaults of `ymirflow webhook`.
const (
	DefaultWebhookAddr          = ":8082" // the console has 8080, fakejira 8081
	DefaultWebhookMaxBody       = 1 << 20
	DefaultWebhookDeadline      = 900 * time.Millisecond
	DefaultWebhookPayloadMaxAge = 10 * time.Second
	DefaultWebhookDeliveryTTL   = 24 * time.Hour
	// DefaultWebhookCommentMaxBytes is webhook.DefaultCommentMaxBytes (config names no
	// library it need not): the bound of a comment's text handed to an agent.
	DefaultWebhookCommentMaxBytes = 4096
	minWebhookCommentMaxBytes     = 64
	// maxApprovalUSD is agentctl.MaxCostUSD: the largest raise one approval makes.
	maxApprovalUSD = 10_000
)

// WebhookSecret is the shared secret of a Jira webhook, from a flag or a file; embedded by
// the receiver (which checks signatures) and the fake Jira (which signs).
type WebhookSecret struct {
	WebhookSecret     string // --webhook-secret, WEBHOOK_SECRET: the webhook's secret
	WebhookSecretFile string // --webhook-secret-file, WEBHOOK_SECRET_FILE: file holding it (read at start)
}

func (s *WebhookSecret) register(fs *flag.FlagSet, usage string) {
	fs.StringVar(&s.WebhookSecret, "webhook-secret", "", usage+"; prefer --webhook-secret-file")
	fs.StringVar(&s.WebhookSecretFile, "webhook-secret-file", "", "file that holds the webhook secret, read once at start-up: restart the process after rotating it")
}

func (s *WebhookSecret) validate(p *problems) {
	if s.WebhookSecret != "" && s.WebhookSecretFile != "" {
		p.add("webhook-secret-file", "and WEBHOOK_SECRET (--webhook-secret) are both set; set one")
	}
	if s.WebhookSecretFile != "" {
		secret, err := ReadSecretFile(s.WebhookSecretFile)
		switch {
		case err != nil:
			p.add("webhook-secret-file", "= %q cannot be read: %v", s.WebhookSecretFile, err)
		case secret == "":
			p.add("webhook-secret-file", "= %q is empty", s.WebhookSecretFile)
		}
	}
}

// Secret returns the secret: WebhookSecret, or the trimmed content of WebhookSecretFile,
// read now; "" when neither is set.
func (s *WebhookSecret) Secret() (string, error) {
	if s.WebhookSecret != "" || s.WebhookSecretFile == "" {
		return s.WebhookSecret, nil
	}
	secret, err := ReadSecretFile(s.WebhookSecretFile)
	if err != nil {
		return "", &SettingError{Env: "WEBHOOK_SECRET_FILE", Flag: "webhook-secret-file",
			Msg: "= " + s.WebhookSecretFile + " cannot be read: " + err.Error()}
	}
	return secret, nil
}

// Webhook is the settings of `ymirflow webhook`: the Jira webhook receiver.
type Webhook struct {
	Common
	Jira
	Tracing
	WebhookSecret

	Addr                string        // --addr, ADDR: listen address of the receiver
	MetricsAddr         string        // --metrics-addr, METRICS_ADDR: /metrics, /healthz, /readyz (empty: none)
	InsecureNoSignature bool          // --insecure-no-signature, INSECURE_NO_SIGNATURE: accept unsigned deliveries when no secret is set
	JiraOwnAccount      string        // --jira-own-account, JIRA_OWN_ACCOUNT: ymirflow's Jira account ids or usernames, comma-separated (empty: asked from Jira's /myself at start)
	WebhookCheckScope   bool          // --webhook-check-scope, WEBHOOK_CHECK_SCOPE: act only on issues matching JIRA_JQL (one search per delivery)
	WebhookMaxBody      int64         // --webhook-max-body, WEBHOOK_MAX_BODY: largest body accepted, bytes
	WebhookDeadline     time.Duration // --webhook-deadline, WEBHOOK_DEADLINE: bound of the answer to one delivery (checks and the inbox append)
	WebhookPayloadAge   time.Duration // --webhook-payload-max-age, WEBHOOK_PAYLOAD_MAX_AGE: older deliveries (retries) are not trusted to describe the issue
	WebhookDeliveryTTL  time.Duration // --webhook-delivery-ttl, WEBHOOK_DELIVERY_TTL: how long delivery ids are remembered
	WebhookCommentMax   int           // --webhook-comment-max-bytes, WEBHOOK_COMMENT_MAX_BYTES: bound of a comment's text delivered as a follow-up
	WebhookApprovalUSD  float64       // --webhook-approval-usd, WEBHOOK_APPROVAL_USD: what a maintainer's ymir_budget_approved label adds to the budget (0: off)
	StaleLabelThreshold time.Duration // --stale-label-threshold, STALE_LABEL_THRESHOLD: as the fetcher's
}

// Register defines the receiver's flags on fs.
func (w *Webhook) Register(fs *flag.FlagSet) {
	w.Common.Register(fs)
	w.Jira.Register(fs)
	w.Tracing.register(fs)
	w.WebhookSecret.register(fs, "the Jira webhook's secret: deliveries must carry X-Hub-Signature: sha256=<HMAC-SHA256 of the body>")
	fs.StringVar(&w.Addr, "addr", DefaultWebhookAddr, "listen address of the webhook receiver")
	required(fs, "jira-url", "required: the receiver reads issues and writes labels")
	required(fs, "webhook-secret", "required (or its file) unless --insecure-no-signature")
	fs.StringVar(&w.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "listen address of /metrics, /healthz and /readyz (empty: none); the default, a free port on loopback, is logged at start")
	fs.BoolVar(&w.InsecureNoSignature, "insecure-no-signature", false, "accept unsigned deliveries when no secret is set (never in production)")
	fs.StringVar(&w.JiraOwnAccount, "jira-own-account", "", "ymirflow's own Jira account ids or usernames, comma-separated: events they cause and comments they write are ignored, never delivered to an agent (empty: Jira's /myself at start)")
	fs.BoolVar(&w.WebhookCheckScope, "webhook-check-scope", true, "act only on issues that match JIRA_JQL (one Jira search per delivery)")
	fs.Int64Var(&w.WebhookMaxBody, "webhook-max-body", DefaultWebhookMaxBody, "largest delivery body accepted, in bytes (larger: 413)")
	fs.DurationVar(&w.WebhookDeadline, "webhook-deadline", DefaultWebhookDeadline, "bound of the answer to one delivery: its checks and its append to the inbox (classified after the answer); cut short: 503, and Jira retries")
	fs.DurationVar(&w.WebhookPayloadAge, "webhook-payload-max-age", DefaultWebhookPayloadMaxAge, "a delivery older than this (a retry) is not trusted to describe the issue: it is read from Jira")
	fs.DurationVar(&w.WebhookDeliveryTTL, "webhook-delivery-ttl", DefaultWebhookDeliveryTTL, "how long delivery ids are remembered, to drop Jira's retries of a delivery already handled")
	fs.IntVar(&w.WebhookCommentMax, "webhook-comment-max-bytes", DefaultWebhookCommentMaxBytes, "a maintainer's comment on an issue a run holds is published to that run as a follow-up (comment.created), its text redacted and cut to this many bytes (at least 64)")
	fs.Float64Var(&w.WebhookApprovalUSD, "webhook-approval-usd", 0, "a maintainer (a member of JIRA_TRIGGER_GROUP) who adds the label ymir_budget_approved to an issue parked for its budget raises the budget by this many USD and resumes the work; the label is then removed, to be added again for the next approval (0: approvals by label are off; a comment \"/ymir budget +N\" approves N USD either way)")
	fs.DurationVar(&w.StaleLabelThreshold, "stale-label-threshold", DefaultStaleThreshold, "an in-flight label on an issue not updated for this long is recovered")
}

// OwnAccounts returns JiraOwnAccount split on commas.
func (w *Webhook) OwnAccounts() []string {
	var out []string
	for _, a := range strings.Split(w.JiraOwnAccount, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Validate checks the receiver's settings.
func (w *Webhook) Validate() error {
	var p problems
	w.Common.validate(&p)
	w.Jira.validate(&p)
	w.Tracing.validate(&p)
	w.WebhookSecret.validate(&p)
	if w.JiraURL == "" {
		p.add("jira-url", "is required: the receiver reads issues and writes labels in Jira")
	}
	switch {
	case w.WebhookCheckScope && strings.TrimSpace(w.JiraJQL) == "":
		p.add("jira-jql", "is required with WEBHOOK_CHECK_SCOPE=true: the scope of the deliveries acted on")
	case strings.TrimSpace(w.JiraJQL) == "":
		p.add("jira-jql", "is required: the receiver classifies deliveries with the fetcher, which takes it")
	}
	if w.WebhookSecret.WebhookSecret == "" && w.WebhookSecretFile == "" && !w.InsecureNoSignature {
		p.add("webhook-secret", "is required (or WEBHOOK_SECRET_FILE): unsigned deliveries are refused unless INSECURE_NO_SIGNATURE (--insecure-no-signature) is given")
	}
	if _, _, err := net.SplitHostPort(w.Addr); err != nil {
		p.add("addr", "= %q must be host:port or :port", w.Addr)
	}
	if w.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(w.MetricsAddr); err != nil {
			p.add("metrics-addr", "= %q must be host:port or :port", w.MetricsAddr)
		}
	}
	if w.WebhookMaxBody <= 0 {
		p.add("webhook-max-body", "= %d must be positive", w.WebhookMaxBody)
	}
	if w.WebhookDeadline <= 0 || w.WebhookDeadline > 10*time.Second {
		p.add("webhook-deadline", "= %s must be positive and at most 10s (Jira waits about 10s for an answer)", fmtDur(w.WebhookDeadline))
	}
	if w.WebhookPayloadAge <= 0 {
		p.add("webhook-payload-max-age", "= %s must be positive", fmtDur(w.WebhookPayloadAge))
	}
	if w.WebhookDeliveryTTL <= 0 {
		p.add("webhook-delivery-ttl", "= %s must be positive", fmtDur(w.WebhookDeliveryTTL))
	}
	if w.WebhookCommentMax < minWebhookCommentMaxBytes {
		p.add("webhook-comment-max-bytes", "= %d must be at least %d", w.WebhookCommentMax, minWebhookCommentMaxBytes)
	}
	if w.WebhookApprovalUSD < 0 || w.WebhookApprovalUSD > maxApprovalUSD {
		p.add("webhook-approval-usd", "= %v must be 0 (off) to %d USD", w.WebhookApprovalUSD, maxApprovalUSD)
	}
	if w.StaleLabelThreshold <= 0 {
		p.add("stale-label-threshold", "= %s must be positive", fmtDur(w.StaleLabelThreshold))
	}
	return p.err()
}
