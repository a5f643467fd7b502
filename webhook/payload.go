package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// Webhook events the receiver acts on.
const (
	EventIssueCreated   = "jira:issue_created"
	EventIssueUpdated   = "jira:issue_updated"
	EventCommentCreated = "comment_created"
)

// Event is the part of a Jira webhook delivery the receiver reads: Atlassian's shape,
// {"timestamp": ms, "webhookEvent": "jira:issue_updated", "user": {...}, "issue": {...},
// "changelog": {"id": ..., "items": [{"field": "labels", "fromString": ..., "toString": ...}]},
// "comment": {...}}. Other members are ignored.
type Event struct {
	Timestamp    int64       `json:"timestamp"`
	WebhookEvent string      `json:"webhookEvent"`
	User         *jira.User  `json:"user"`
	Issue        *jira.Issue `json:"issue"`
	Changelog    *struct {
		ID    string            `json:"id"`
		Items []jira.ChangeItem `json:"items"`
	} `json:"changelog"`
	Comment *Comment `json:"comment"`
}

// Comment is the comment of a comment_created delivery: its Jira id, author and body (a
// string on Jira Server and in Jira Cloud's webhooks, an Atlassian Document Format
// object where API v3 shapes it; Text reads both).
type Comment struct {
	ID     string          `json:"id"`
	Author jira.User       `json:"author"`
	Body   json.RawMessage `json:"body"`
}

// errMalformed marks a body that is not a Jira webhook payload (400).
var errMalformed = errors.New("webhook: malformed payload")

// parseEvent decodes body. It wants a JSON object with webhookEvent and, for issue and
// comment events, an issue with a key.
func parseEvent(body []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(body, &e); err != nil {
		return Event{}, fmt.Errorf("%w: %w", errMalformed, err)
	}
	if strings.TrimSpace(e.WebhookEvent) == "" {
		return Event{}, fmt.Errorf("%w: no webhookEvent", errMalformed)
	}
	switch e.WebhookEvent {
	case EventIssueCreated, EventIssueUpdated, EventCommentCreated:
		if e.Issue == nil || strings.TrimSpace(e.Issue.Key) == "" {
			return Event{}, fmt.Errorf("%w: %s without issue.key", errMalformed, e.WebhookEvent)
		}
	}
	if e.WebhookEvent == EventCommentCreated {
		// The comment's id is what makes a redelivery of it one follow-up, not two.
		if e.Comment == nil || strings.TrimSpace(e.Comment.ID) == "" {
			return Event{}, fmt.Errorf("%w: %s without comment.id", errMalformed, e.WebhookEvent)
		}
		if len(e.Comment.ID) > maxCommentID {
			return Event{}, fmt.Errorf("%w: comment.id longer than %d bytes", errMalformed, maxCommentID)
		}
	}
	return e, nil
}

// At is when Jira raised the event (zero when the payload has no timestamp).
func (e Event) At() time.Time {
	if e.Timestamp <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(e.Timestamp)
}

// addedLabel reports whether the event's changelog adds label.
func (e Event) addedLabel(label string) bool {
	if e.Changelog == nil {
		return false
	}
	for _, it := range e.Changelog.Items {
		if slices.Contains(it.AddedLabels(), label) {
			return true
		}
	}
	return false
}

// missingFields are the names the payload's issue does not carry (a null value counts as
// carried: Jira sends unset fields as null).
func missingFields(is *jira.Issue, names []string) []string {
	var out []string
	for _, n := range names {
		if _, ok := is.Fields.Raw[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// withFields is the payload's issue with the fields names taken from read (null where
// read lacks one too): the payload's labels, which its changelog describes, stay.
func withFields(payload, read jira.Issue, names []string) (jira.Issue, error) {
	raw := make(map[string]json.RawMessage, len(payload.Fields.Raw)+len(names))
	for k, v := range payload.Fields.Raw {
		raw[k] = v
	}
	for _, n := range names {
		v, ok := read.Fields.Raw[n]
		if !ok {
			v = json.RawMessage("null")
		}
		raw[n] = v
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return jira.Issue{}, fmt.Errorf("webhook: fields of %s: %w", payload.Key, err)
	}
	out := payload
	if err := json.Unmarshal(b, &out.Fields); err != nil {
		return jira.Issue{}, fmt.Errorf("webhook: fields of %s: %w", payload.Key, err)
	}
	return out, nil
}
