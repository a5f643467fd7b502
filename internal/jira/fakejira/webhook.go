package fakejira

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// Defaults for the webhook options.
const (
	DefaultWebhookRetries    = 3
	DefaultWebhookRetryDelay = 100 * time.Millisecond
	// HeaderActAs makes a PUT act as another user (the accountId or username of a user of
	// Options.Groups, or any id): the changelog author and the webhook's user.
	HeaderActAs = "X-Fakejira-User"
)

// WebhookTarget is one registered webhook: deliveries are POSTed to URL, signed with
// Secret (X-Hub-Signature: sha256=<hex HMAC-SHA256 of the body>) unless Secret is empty.
type WebhookTarget struct {
	URL    string
	Secret string
}

// Delivery is one webhook delivery, after its last attempt.
type Delivery struct {
	ID       string // X-Atlassian-Webhook-Identifier, the same on every attempt
	URL      string
	Event    string // webhookEvent
	Key      string
	Attempts int
	Status   int // of the last attempt; 0 when it failed without an answer
	Err      string
	// Queued is when the change happened; Done when the last attempt ended.
	Queued, Done time.Time
}

// hookState counts the deliveries in flight under mu, not with a sync.WaitGroup: a
// delivery is queued by whatever changes an issue (a test, or the system under test
// calling the API) while a test may be in WaitWebhooks, and a WaitGroup's Add from zero
// must not run concurrently with its Wait.
type hookState struct {
	client     *http.Client
	mu         sync.Mutex
	pending    int           // deliveries queued and not done
	idle       chan struct{} // closed when pending drops to 0; nil while none was queued
	deliveries []Delivery
}

// add counts one more delivery in flight.
func (h *hookState) add() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == 0 {
		h.idle = make(chan struct{})
	}
	h.pending++
}

// done records d, after its last attempt, and counts it out.
func (h *hookState) done(d Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deliveries = append(h.deliveries, d)
	if len(h.deliveries) > maxLog {
		h.deliveries = slices.Delete(h.deliveries, 0, len(h.deliveries)-maxLog)
	}
	h.pending--
	if h.pending == 0 {
		close(h.idle)
	}
}

// quiet returns a channel closed once no delivery queued so far is in flight.
func (h *hookState) quiet() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	return h.idle
}

// jqlKeyPattern finds a `key = X` clause, the only JQL the fake honours (the webhook
// receiver's scope check); any other JQL matches every issue.
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var jqlKeyPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?i)\bkey\s*=\s*"?([A-Za-z][A-Za-z0-9_]*-[0-9]+)"?`) })

func jqlKey(jql string) (string, bool) {
	m := jqlKeyPattern().FindStringSubmatch(jql)
	if m == nil {
		return "", false
	}
	return strings.ToUpper(m[1]), true
}

// actingUser is the user a request acts as: HeaderActAs, else Options.CurrentUser.
func (s *Server) actingUser(r *http.Request) jira.User {
	if id := strings.TrimSpace(r.Header.Get(HeaderActAs)); id != "" {
		return jira.User{AccountID: id, Name: id, DisplayName: id}
	}
	return s.opts.CurrentUser
}

// setLabels records a label change by user (changelog, updated) and queues its webhook.
// It runs with s.mu held.
func (s *Server) setLabels(host string, is *Issue, by jira.User, labels []string, now time.Time) {
	if slices.Equal(labels, is.Labels) || (len(labels) == 0 && len(is.Labels) == 0) {
		return
	}
	item := jira.ChangeItem{Field: "labels", FieldType: "jira",
		FromString: strings.Join(is.Labels, " "), ToString: strings.Join(labels, " ")}
	entry := jira.ChangelogEntry{ID: strconv.Itoa(s.nextID), Author: by, Created: jira.Time{Time: now},
		Items: []jira.ChangeItem{item}}
	s.nextID++
	is.Changelog = append(is.Changelog, entry)
	is.Labels = labels
	is.Updated = now
	s.queueWebhook(host, "jira:issue_updated", "issue_updated", is, by, &entry, now)
}

// ChangeLabels adds and removes labels as user by, as an edit in Jira's UI would: a
// changelog entry by that user, and a webhook delivery. It reports false for an unknown key.
func (s *Server) ChangeLabels(key string, by jira.User, add, remove []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	is, ok := s.byKey[strings.ToUpper(strings.TrimSpace(key))]
	if !ok {
		return false
	}
	labels := slices.Clone(is.Labels)
	for _, a := range add {
		if !slices.Contains(labels, a) {
			labels = append(labels, a)
		}
	}
	labels = slices.DeleteFunc(labels, func(l string) bool { return slices.Contains(remove, l) })
	s.setLabels(s.hostLocked(), is, by, labels, s.opts.Clock())
	return true
}

// CreateIssue adds an issue created by user by, and sends jira:issue_created.
func (s *Server) CreateIssue(is Issue, by jira.User) {
	if is.Created.IsZero() {
		is.Created = s.opts.Clock()
	}
	if is.Updated.IsZero() {
		is.Updated = is.Created
	}
	s.AddIssues(is)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.byKey[strings.ToUpper(strings.TrimSpace(is.Key))]; ok {
		s.queueWebhook(s.hostLocked(), "jira:issue_created", "issue_created", p, by, nil, s.opts.Clock())
	}
}

func (s *Server) hostLocked() string {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	return strings.TrimPrefix(s.url, "http://")
}

// queueWebhook builds the delivery (Atlassian's shape: timestamp, webhookEvent,
// issue_event_type_name, user, issue with every field, changelog {id, items}) under s.mu and
// sends it to every target in the background.
func (s *Server) queueWebhook(host, event, typeName string, is *Issue, by jira.User, entry *jira.ChangelogEntry, now time.Time) {
	if len(s.opts.Webhooks) == 0 {
		return
	}
	payload := map[string]any{
		"timestamp":             now.UnixMilli(),
		"webhookEvent":          event,
		"issue_event_type_name": typeName,
		"user":                  by,
		"issue":                 s.render(host, is, nil, false),
	}
	if entry != nil {
		items := make([]map[string]any, 0, len(entry.Items))
		for _, it := range entry.Items {
			items = append(items, map[string]any{"field": it.Field, "fieldtype": it.FieldType, "fieldId": it.Field,
				"from": nil, "fromString": it.FromString, "to": nil, "toString": it.ToString})
		}
		payload["changelog"] = map[string]any{"id": entry.ID, "items": items}
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return
	}
	for _, t := range s.opts.Webhooks {
		d := Delivery{ID: newDeliveryID(), URL: t.URL, Event: event, Key: is.Key, Queued: time.Now()}
		s.hooks.add()
		go s.deliver(t, d, body)
	}
}

// AddComment adds a comment by user by to the issue, as writing it in Jira's UI would,
// and sends comment_created. It returns the comment, or false for an unknown key.
func (s *Server) AddComment(key string, by jira.User, body string) (Comment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	is, ok := s.byKey[strings.ToUpper(strings.TrimSpace(key))]
	if !ok {
		return Comment{}, false
	}
	now := s.opts.Clock()
	c := Comment{ID: strconv.Itoa(s.nextID), Body: body, Author: by, Created: now}
	s.nextID++
	is.Comments = append(is.Comments, c)
	is.Updated = now
	s.queueComment(s.hostLocked(), is, c, now)
	return c, true
}

// queueComment sends comment_created for c (Atlassian's shape: timestamp, webhookEvent,
// comment {id, author, body, created, updated}, issue) to every target. It runs with
// s.mu held.
func (s *Server) queueComment(host string, is *Issue, c Comment, now time.Time) {
	if len(s.opts.Webhooks) == 0 {
		return
	}
	body, err := json.Marshal(map[string]any{
		"timestamp":    now.UnixMilli(),
		"webhookEvent": "comment_created",
		"comment":      toCommentJSON(c),
		"issue":        s.render(host, is, nil, false),
	})
	if err != nil {
		return
	}
	for _, t := range s.opts.Webhooks {
		d := Delivery{ID: newDeliveryID(), URL: t.URL, Event: "comment_created", Key: is.Key, Queued: time.Now()}
		s.hooks.add()
		go s.deliver(t, d, body)
	}
}

func newDeliveryID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// deliver POSTs body to t until a 2xx, at most 1+WebhookRetries times, as Jira does for
// failed deliveries (network errors, 408, 409, 425, 429 and 5xx); other statuses are final.
func (s *Server) deliver(t WebhookTarget, d Delivery, body []byte) {
	delay := s.opts.WebhookRetryDelay
	for attempt := 0; attempt <= s.opts.WebhookRetries; attempt++ {
		if attempt > 0 {
			time.Sleep(delay)
			delay *= 2
		}
		d.Attempts++
		d.Status, d.Err = s.post(t, d.ID, attempt, body)
		if d.Err == "" && !retryable(d.Status) {
			break
		}
	}
	d.Done = time.Now()
	s.hooks.done(d)
}

func retryable(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

func (s *Server) post(t WebhookTarget, id string, attempt int, body []byte) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Atlassian Webhook HTTP Client")
	req.Header.Set("X-Atlassian-Webhook-Identifier", id)
	req.Header.Set("X-Atlassian-Webhook-Retry", strconv.Itoa(attempt))
	if t.Secret != "" {
		m := hmac.New(sha256.New, []byte(t.Secret))
		m.Write(body)
		req.Header.Set("X-Hub-Signature", "sha256="+hex.EncodeToString(m.Sum(nil)))
	}
	resp, err := s.hooks.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = bytes.NewBuffer(nil).ReadFrom(resp.Body)
	return resp.StatusCode, ""
}

// WaitWebhooks waits until every delivery queued so far has had its last attempt, or ctx
// ends.
func (s *Server) WaitWebhooks(ctx context.Context) error {
	select {
	case <-s.hooks.quiet():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Deliveries returns the webhook deliveries that are done (last attempt made), oldest
// first.
func (s *Server) Deliveries() []Delivery {
	s.hooks.mu.Lock()
	defer s.hooks.mu.Unlock()
	return slices.Clone(s.hooks.deliveries)
}

// createIssue implements POST /rest/api/2/issue with {"fields":{"project":{"key":P},
// "summary":…,"labels":[…]}}: the issue gets the next number of its project, and
// jira:issue_created goes to the webhooks, by the acting user. It runs with s.mu held.
func (s *Server) createIssue(r *http.Request, body []byte) reply {
	var req struct {
		Fields struct {
			Project struct {
				Key string `json:"key"`
			} `json:"project"`
			Summary string   `json:"summary"`
			Labels  []string `json:"labels"`
		} `json:"fields"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return errReply(http.StatusBadRequest, "fakejira: bad issue: "+err.Error())
	}
	project := strings.ToUpper(strings.TrimSpace(req.Fields.Project.Key))
	if project == "" {
		return errReply(http.StatusBadRequest, "fakejira: fields.project.key is required")
	}
	next := 1
	for k := range s.byKey {
		if p, n, ok := strings.Cut(k, "-"); ok && p == project {
			if v, err := strconv.Atoi(n); err == nil && v >= next {
				next = v + 1
			}
		}
	}
	now := s.opts.Clock()
	is := &Issue{Key: project + "-" + strconv.Itoa(next), ID: strconv.Itoa(s.nextID), Summary: req.Fields.Summary,
		Status: "New", Labels: slices.Clone(req.Fields.Labels), Created: now, Updated: now}
	s.nextID++
	s.issues = append(s.issues, is)
	s.byKey[is.Key] = is
	s.logWrite(Write{Method: r.Method, Path: r.URL.Path, Key: is.Key, Add: slices.Clone(is.Labels), At: now})
	s.queueWebhook(r.Host, "jira:issue_created", "issue_created", is, s.actingUser(r), nil, now)
	return jsonReply(http.StatusCreated, map[string]string{"id": is.ID, "key": is.Key,
		"self": "http://" + r.Host + "/rest/api/2/issue/" + is.ID})
}
