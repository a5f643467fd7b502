package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/fetcher"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// Defaults for Config.
const (
	DefaultMaxBody       = 1 << 20
	DefaultDeadline      = 900 * time.Millisecond
	DefaultDeliveryTTL   = 24 * time.Hour
	DefaultMaxPayloadAge = 10 * time.Second
	// DefaultProcessTimeout bounds the classification of one stored delivery (Jira
	// reads under the Jira client's rate limit, the lease pre-check, the publish).
	DefaultProcessTimeout = 10 * time.Second
	// DefaultRetryAfter is how long a stored delivery whose classification failed (or
	// whose receiver died) waits before it is taken again. It must exceed ProcessTimeout,
	// or a delivery still being classified could be taken by another replica.
	DefaultRetryAfter = 30 * time.Second
	// DefaultMaxAttempts bounds the classifications of one delivery; after the last the
	// delivery is given up (logged, counted): the next sweep still sees the issue.
	DefaultMaxAttempts = 10
	// DefaultInboxMaxLen bounds the inbox (approximately): it holds only the backlog,
	// classified entries are deleted.
	DefaultInboxMaxLen = 100_000
	// InboxGroup is the consumer group of the inbox: every replica's processor is a
	// consumer of it.
	InboxGroup = "webhook"
)

// Header names Jira sends.
const (
	HeaderSignature = "X-Hub-Signature"
	HeaderDelivery  = "X-Atlassian-Webhook-Identifier"
)

// ErrNoSecret is returned by New when no secret is configured and unsigned deliveries were
// not explicitly allowed.
var ErrNoSecret = errors.New("webhook: no Config.Secret, and Config.InsecureNoSignature is not set: unsigned deliveries would be accepted")

// Config configures a Receiver. Fetcher, Jira and Redis are required, and a Secret unless
// InsecureNoSignature.
type Config struct {
	// Fetcher classifies and publishes, exactly as a sweep does (fetcher.Process).
	Fetcher *fetcher.Fetcher
	// Jira reads the issues a payload does not describe well enough, and checks scope.
	Jira *jira.Client
	// Redis remembers delivery ids, stores deliveries and publishes comments as
	// follow-ups.
	Redis redis.UniversalClient
	// Locker gives the lease key names and the key canonicalisation (which run holds an
	// issue a comment is about). Nil: a Locker on Redis in Topology's lock scope.
	Locker *lease.Locker
	// Topology gives the namespace of the receiver's keys.
	Topology event.Topology
	// Secret is the webhook's secret: deliveries must carry X-Hub-Signature:
	// sha256=<hex HMAC-SHA256 of the body>.
	Secret []byte
	// InsecureNoSignature accepts unsigned deliveries when Secret is empty.
	InsecureNoSignature bool
	// OwnAccounts are the account ids or usernames of ymirflow's own Jira account: events
	// they caused (its label flips) and comments they wrote (the agents' own) are
	// ignored, never delivered to an agent.
	OwnAccounts []string
	// CommentMaxBytes bounds the text of a comment published as a follow-up (default
	// DefaultCommentMaxBytes, at least MinCommentMaxBytes): a longer one is cut and
	// ends with "[truncated]".
	CommentMaxBytes int
	// ApprovalLabelUSD is what a maintainer's budget approval by label
	// (ymir_budget_approved, added by a member of the fetcher's trigger group) adds to
	// the issue's budget, in USD. 0 (the default): approvals by label are off (approvals
	// by comment, "/ymir budget +N", state their amount).
	ApprovalLabelUSD float64
	// Redactor masks ymirflow's own secrets in a comment's text before it is published
	// (credential-shaped text is masked whatever it holds: redact.Tokens). Nil: only
	// the shapes.
	Redactor *redact.Redactor
	// MaxLen bounds the stage streams comments are published to (approximate trim that
	// keeps what a group still needs; default event.DefaultMaxLen).
	MaxLen int64
	// JQL, when set, is the fetcher's search: an issue is acted on only when it matches
	// (one search "key = K AND (JQL)"), so a registration without a JQL filter cannot
	// start work on issues the sweep would never look at.
	JQL string
	// MaxBody bounds a delivery's body (default 1 MiB); larger ones get 413.
	MaxBody int64
	// Deadline bounds the answer to one delivery (default 900ms): the checks and the
	// append to the inbox; a Redis that does not answer in time gets 503 and Jira retries.
	// The classification runs after the answer, in Run, bounded by ProcessTimeout.
	Deadline time.Duration
	// ProcessTimeout bounds the classification of one stored delivery (default 10s);
	// RetryAfter is how long a failed one waits before it is taken again (default 30s,
	// more than ProcessTimeout); MaxAttempts bounds its classifications (default 10).
	ProcessTimeout, RetryAfter time.Duration
	MaxAttempts                int
	// InboxMaxLen bounds the inbox stream (default 100 000, approximate).
	InboxMaxLen int64
	// Consumer is this process's consumer name in the inbox's group (default
	// "<hostname>-<pid>"): entries a dead process left are taken by another after
	// RetryAfter, whatever its name.
	Consumer string
	// MaxPayloadAge: a delivery whose event is older than this (a retry) is not trusted to
	// describe the issue; the issue is read from Jira. Default 10s.
	MaxPayloadAge time.Duration
	// DeliveryTTL is how long a delivery id is remembered (default 24h).
	DeliveryTTL time.Duration
	// Metrics counts deliveries; nil: not counted.
	Metrics *Metrics
	Logger  zerolog.Logger
	// Clock is the time source for the payload's age; default time.Now.
	Clock func() time.Time
	// TracerProvider traces each stored delivery's classification (the root of an issue
	// run's trace; the publish, Config.Fetcher's, is its child when the fetcher traces
	// too). Nil: no spans.
	TracerProvider trace.TracerProvider
}

// Receiver is the http.Handler that takes Jira's webhook deliveries, and (Run) the
// loop that classifies them. Build it with New.
type Receiver struct {
	cfg    Config
	own    map[string]bool
	fields []string
	ns     string
	log    zerolog.Logger
	// processed, when set (tests), hears the outcome of every inbox entry classified.
	processed func(inboxID string, res result)
	tracer    trace.Tracer
	locker    *lease.Locker
	pub       *event.Publisher
	// ledger is the agents' budget ledger (package agentctl), under the topology's
	// namespace: a maintainer's approval raises it.
	ledger *agentctl.Ledger
}

// New validates cfg and returns a Receiver. It does no I/O.
func New(cfg Config) (*Receiver, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Receiver{cfg: cfg, own: map[string]bool{}, fields: cfg.Fetcher.SearchFields(),
		ns: cfg.Topology.Namespace, log: cfg.Logger.With().Str("component", "webhook").Logger(),
		tracer: event.Tracer(cfg.TracerProvider), locker: cfg.Locker,
		pub: event.NewPublisher(cfg.Redis, cfg.MaxLen).WithTracerProvider(cfg.TracerProvider)}
	if r.ns == "" {
		r.ns = event.DefaultNamespace
	}
	if r.ledger, err = agentctl.NewLedger(cfg.Redis, r.ns+":", agentctl.Budgets{}); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	for _, a := range cfg.OwnAccounts {
		if a = strings.TrimSpace(a); a != "" {
			r.own[a] = true
		}
	}
	return r, nil
}

// validate refuses a Config New cannot run with, naming the field.
func (cfg Config) validate() error {
	switch {
	case cfg.Fetcher == nil:
		return errors.New("webhook: Config.Fetcher is required")
	case cfg.Jira == nil:
		return errors.New("webhook: Config.Jira is required")
	case cfg.Redis == nil:
		return errors.New("webhook: Config.Redis is required")
	case len(cfg.Secret) == 0 && !cfg.InsecureNoSignature:
		return ErrNoSecret
	case cfg.MaxBody < 0 || cfg.Deadline < 0 || cfg.MaxPayloadAge < 0 || cfg.DeliveryTTL < 0 ||
		cfg.ProcessTimeout < 0 || cfg.RetryAfter < 0 || cfg.MaxAttempts < 0 || cfg.InboxMaxLen < 0 || cfg.MaxLen < 0:
		return errors.New("webhook: MaxBody, Deadline, MaxPayloadAge, DeliveryTTL, ProcessTimeout, RetryAfter, MaxAttempts, InboxMaxLen and MaxLen must not be negative")
	case cfg.ApprovalLabelUSD < 0 || cfg.ApprovalLabelUSD > agentctl.MaxCostUSD:
		return fmt.Errorf("webhook: ApprovalLabelUSD (%v) must be 0 (off) to %d USD", cfg.ApprovalLabelUSD, agentctl.MaxCostUSD)
	case cfg.CommentMaxBytes != 0 && cfg.CommentMaxBytes < MinCommentMaxBytes:
		return fmt.Errorf("webhook: CommentMaxBytes (%d) must be at least %d", cfg.CommentMaxBytes, MinCommentMaxBytes)
	}
	return nil
}

// withDefaults is cfg with every zero field set to its default (and a Locker built
// when there is none); it refuses a RetryAfter that does not exceed ProcessTimeout.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.CommentMaxBytes == 0 {
		cfg.CommentMaxBytes = DefaultCommentMaxBytes
	}
	if cfg.MaxLen == 0 {
		cfg.MaxLen = event.DefaultMaxLen
	}
	if cfg.Locker == nil {
		o := lease.Options{Scope: cfg.Topology.LockScope()}
		if _, cluster := cfg.Redis.(*redis.ClusterClient); cluster {
			o.Format = lease.KeysCluster
		}
		l, err := lease.New(cfg.Redis, o)
		if err != nil {
			return cfg, fmt.Errorf("webhook: %w", err)
		}
		cfg.Locker = l
	}
	if cfg.ProcessTimeout == 0 {
		cfg.ProcessTimeout = DefaultProcessTimeout
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = max(DefaultRetryAfter, 2*cfg.ProcessTimeout)
	}
	if cfg.RetryAfter <= cfg.ProcessTimeout {
		return cfg, fmt.Errorf("webhook: RetryAfter (%s) must exceed ProcessTimeout (%s): a delivery being classified could be taken again", cfg.RetryAfter, cfg.ProcessTimeout)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.InboxMaxLen == 0 {
		cfg.InboxMaxLen = DefaultInboxMaxLen
	}
	if cfg.Consumer == "" {
		host, _ := os.Hostname()
		cfg.Consumer = host + "-" + strconv.Itoa(os.Getpid())
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.MaxPayloadAge == 0 {
		cfg.MaxPayloadAge = DefaultMaxPayloadAge
	}
	if cfg.DeliveryTTL == 0 {
		cfg.DeliveryTTL = DefaultDeliveryTTL
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return cfg, nil
}

// Sign returns the X-Hub-Signature value Jira sends for body: "sha256=" and the hex
// HMAC-SHA256 of body keyed with secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// DeliveryKey is the Redis key remembering a delivery id:
// "<namespace>:webhook:delivery:<sha256 of the id>" (hashed: the id is the sender's text).
func DeliveryKey(t event.Topology, id string) string {
	ns := t.Namespace
	if ns == "" {
		ns = event.DefaultNamespace
	}
	sum := sha256.Sum256([]byte(id))
	return ns + ":webhook:delivery:" + hex.EncodeToString(sum[:16])
}

// InboxStream is the stream deliveries are stored in before they are classified:
// "<namespace>:webhook:inbox". Entries carry the raw body and the delivery id; the
// InboxGroup reads them, and an entry is deleted once classified.
func InboxStream(t event.Topology) string {
	ns := t.Namespace
	if ns == "" {
		ns = event.DefaultNamespace
	}
	return ns + ":webhook:inbox"
}

// result is the answer to one delivery.
type result struct {
	status  int
	outcome string
	detail  string
	issue   string
	entryID string
	stream  string
	err     error
}

func accepted(outcome, detail string) result {
	return result{status: http.StatusAccepted, outcome: outcome, detail: detail}
}

func refused(status int, outcome, detail string) result {
	return result{status: status, outcome: outcome, detail: detail}
}

// ServeHTTP implements http.Handler: 202 "queued" once the delivery is stored in the
// inbox (Run classifies it), 202 "duplicate" for a delivery id already handled,
// 401/405/413/415/400 for deliveries that are not acceptable, 503 when Redis failed (Jira
// retries). Jira is never called here: its rate limit cannot delay the answer.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	delivery := req.Header.Get(HeaderDelivery)
	res := r.serve(w, req, delivery)
	took := time.Since(start)
	r.cfg.Metrics.observe(res.status, res.outcome, took)

	ev := r.log.Debug()
	switch {
	case res.status >= 500:
		ev = r.log.Error().Err(res.err)
	case res.status >= 400:
		ev = r.log.Warn()
	case res.outcome == "published":
		ev = r.log.Info()
	}
	ev.Int("status", res.status).Str("outcome", res.outcome).Str("issue_key", res.issue).
		Str("delivery", delivery).Str("entry_id", res.entryID).Dur("took", took).Msg(res.detail)

	answer := map[string]string{"outcome": res.outcome, "detail": res.detail, "issue_key": res.issue}
	if res.outcome == "queued" {
		answer["inbox_id"], answer["stream"] = res.entryID, res.stream
	}
	body, _ := json.Marshal(answer)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(res.status)
	_, _ = w.Write(append(body, '\n'))
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request, delivery string) result {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return refused(http.StatusMethodNotAllowed, "method_not_allowed", "only POST is accepted")
	}
	if mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return refused(http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Type must be application/json")
	}
	if req.ContentLength > r.cfg.MaxBody {
		return refused(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("body of %d bytes exceeds %d", req.ContentLength, r.cfg.MaxBody))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return refused(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("body exceeds %d bytes", r.cfg.MaxBody))
		}
		return refused(http.StatusBadRequest, "malformed", "reading the body: "+err.Error())
	}
	if len(r.cfg.Secret) > 0 {
		if why := r.checkSignature(req.Header.Get(HeaderSignature), body); why != "" {
			return refused(http.StatusUnauthorized, "bad_signature_"+why, "signature "+why)
		}
	}
	e, err := parseEvent(body)
	if err != nil {
		return refused(http.StatusBadRequest, "malformed", err.Error())
	}

	ctx, cancel := context.WithTimeout(req.Context(), r.cfg.Deadline)
	defer cancel()
	if delivery != "" {
		n, err := r.cfg.Redis.Exists(ctx, DeliveryKey(r.cfg.Topology, delivery)).Result()
		if err != nil {
			return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", detail: "Redis: delivery check failed", err: err}
		}
		if n > 0 {
			return accepted("duplicate", "delivery already handled")
		}
	}
	// Durable first, classified after: once the entry is in the inbox, Run classifies it
	// (retrying, on any replica) whatever happens to this process, so Jira may be told
	// 202 now. A copy that Jira retries meanwhile is classified as a duplicate.
	inbox := InboxStream(r.cfg.Topology)
	id, err := r.cfg.Redis.XAdd(ctx, &redis.XAddArgs{Stream: inbox, MaxLen: r.cfg.InboxMaxLen, Approx: true,
		Values: []any{"body", body, "delivery", delivery, "event", e.WebhookEvent, "received_ms", strconv.FormatInt(time.Now().UnixMilli(), 10)}}).Result()
	if err != nil {
		return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", detail: "Redis: delivery not stored; Jira retries it", err: err}
	}
	res := accepted("queued", "delivery stored; classified in the background")
	res.entryID, res.stream = id, inbox
	if e.Issue != nil {
		res.issue = strings.ToUpper(strings.TrimSpace(e.Issue.Key))
	}
	return res
}

// checkSignature returns "" for a good signature, else why it is not: missing, algorithm
// (not sha256=), malformed (not hex) or mismatch.
func (r *Receiver) checkSignature(header string, body []byte) string {
	header = strings.TrimSpace(header)
	if header == "" {
		return "missing"
	}
	algo, sig, ok := strings.Cut(header, "=")
	if !ok || !strings.EqualFold(algo, "sha256") {
		return "algorithm"
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return "malformed"
	}
	m := hmac.New(sha256.New, r.cfg.Secret)
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return "mismatch"
	}
	return ""
}

func (r *Receiver) ownEvent(e Event) bool {
	for _, u := range []*jira.User{e.User, commentAuthor(e)} {
		if u == nil {
			continue
		}
		for _, id := range []string{u.AccountID, u.Name, u.Key} {
			if id != "" && r.own[id] {
				return true
			}
		}
	}
	return false
}

func commentAuthor(e Event) *jira.User {
	if e.Comment == nil {
		return nil
	}
	return &e.Comment.Author
}

// handle acts on a parsed, authenticated, new delivery.
func (r *Receiver) handle(ctx context.Context, e Event) result {
	if r.ownEvent(e) {
		return accepted("own_account", "caused by ymirflow's own Jira account")
	}
	switch e.WebhookEvent {
	case EventIssueCreated, EventIssueUpdated:
		return r.handleIssue(ctx, e)
	case EventCommentCreated:
		return r.handleComment(ctx, e)
	}
	return accepted("ignored_event", "event "+e.WebhookEvent+" is not acted on")
}

// handleIssue runs the sweep's rules on the event's issue.
func (r *Receiver) handleIssue(ctx context.Context, e Event) result {
	key, err := lease.Canonicalize(e.Issue.Key, nil)
	if err != nil {
		return accepted("skipped_"+string(fetcher.ReasonInvalidKey), err.Error())
	}
	if r.cfg.ApprovalLabelUSD > 0 && e.User != nil && e.Changelog != nil && e.Changelog.ID != "" && e.addedLabel(labels.BudgetApproved) {
		return r.handleLabelApproval(ctx, key, e)
	}
	item, res := r.itemOf(ctx, key, e)
	if res != nil {
		return *res
	}
	sum, err := r.cfg.Fetcher.Process(ctx, item)
	if err != nil {
		if errors.Is(err, fetcher.ErrRedis) {
			return result{status: http.StatusServiceUnavailable, outcome: "redis_unavailable", issue: key, detail: "Redis failed; nothing was acknowledged", err: err}
		}
		return jiraFailed(key, "classify", err)
	}
	if len(sum.Issues) != 1 {
		return result{status: http.StatusInternalServerError, outcome: "error", issue: key, detail: "no outcome", err: fmt.Errorf("webhook: %d outcomes for one issue", len(sum.Issues))}
	}
	o := sum.Issues[0]
	switch {
	case o.Published:
		return result{status: http.StatusAccepted, outcome: "published", issue: o.Key, entryID: o.EntryID, stream: o.Stream, detail: "triage requested (" + string(o.Trigger) + ")"}
	case o.Reason == fetcher.ReasonError:
		return jiraFailed(key, "classify", errors.New(o.Detail))
	}
	return result{status: http.StatusAccepted, outcome: "skipped_" + string(o.Reason), issue: o.Key, entryID: o.EntryID, detail: o.Detail}
}

func jiraFailed(key, what string, err error) result {
	outcome := "jira_unavailable"
	if errors.Is(err, context.DeadlineExceeded) {
		outcome = "timeout"
	}
	return result{status: http.StatusServiceUnavailable, outcome: outcome, issue: key, detail: "Jira: " + what + " failed; Jira retries the delivery", err: err}
}

// itemOf is the issue the rules judge, with as few Jira calls before the publish as the
// payload allows (each waits its turn under the Jira client's rate limit):
//
//   - a fresh payload with its labels is used, and its changelog names who added
//     ymir_todo (no changelog read). If the rules act on nothing in it, no Jira call is
//     made: the scope check guards what is published, and nothing would be. Otherwise one
//     call: the scope search (Config.JQL), which also brings the fields the payload
//     lacks, or, without a JQL, a read of those fields alone;
//   - a retry, or a payload without labels: the issue as Jira has it now, in one call
//     (the scope search with every field the rules read, or a read of the issue).
//
// A non-nil result ends the delivery there (out of scope, gone, Jira failed).
func (r *Receiver) itemOf(ctx context.Context, key string, e Event) (fetcher.Item, *result) {
	fresh := !e.At().IsZero() && r.cfg.Clock().Sub(e.At()) <= r.cfg.MaxPayloadAge
	missing := missingFields(e.Issue, r.fields)
	if !fresh || slices.Contains(missing, "labels") {
		is, res := r.read(ctx, key, r.fields)
		return fetcher.Item{Issue: is}, res
	}
	item := fetcher.Item{Issue: *e.Issue}
	if e.User != nil && e.addedLabel(labels.Todo) {
		item.TodoAddedBy = e.User
	}
	if !r.cfg.Fetcher.Acts(item.Issue) || (r.cfg.JQL == "" && len(missing) == 0) {
		return item, nil
	}
	is, res := r.read(ctx, key, missing)
	if res != nil {
		return item, res
	}
	merged, err := withFields(item.Issue, is, missing)
	if err != nil {
		return item, &result{status: http.StatusInternalServerError, outcome: "error", issue: key, detail: "merging the fields read from Jira", err: err}
	}
	item.Issue = merged
	return item, nil
}

// read reads fields of key in one Jira call: with Config.JQL the scope search
// "key = K AND (JQL)" (an issue outside it is out_of_scope), else the issue itself.
func (r *Receiver) read(ctx context.Context, key string, fields []string) (jira.Issue, *result) {
	if r.cfg.JQL != "" {
		if len(fields) == 0 {
			fields = []string{"labels"} // the search's smallest answer
		}
		page, err := r.cfg.Jira.Search(ctx, jira.SearchRequest{
			JQL: fmt.Sprintf("key = %q AND (%s)", key, r.cfg.JQL), Fields: fields, MaxResults: 1})
		if err != nil {
			res := jiraFailed(key, "scope search", err)
			return jira.Issue{}, &res
		}
		for _, is := range page.Issues {
			if strings.EqualFold(is.Key, key) {
				return is, nil
			}
		}
		return jira.Issue{}, &result{status: http.StatusAccepted, outcome: "out_of_scope", issue: key, detail: "the issue does not match the receiver's JQL"}
	}
	is, err := r.cfg.Jira.GetIssue(ctx, key, fields)
	if errors.Is(err, jira.ErrNotFound) {
		return jira.Issue{}, &result{status: http.StatusAccepted, outcome: "gone", issue: key, detail: "the issue no longer exists or is not visible"}
	}
	if err != nil {
		res := jiraFailed(key, "read the issue", err)
		return jira.Issue{}, &res
	}
	return is, nil
}
