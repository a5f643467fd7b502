package jira

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// checkKey rejects keys that cannot name an issue.
func checkKey(key string) error {
	if strings.TrimSpace(key) == "" {
		return errors.New("jira: empty issue key")
	}
	if strings.ContainsAny(key, "/?#") || strings.IndexFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return fmt.Errorf("jira: invalid issue key %q", key)
	}
	return nil
}

// GetIssue reads one issue: GET /rest/api/2/issue/{key}. fields nil means every field.
func (c *Client) GetIssue(ctx context.Context, key string, fields []string) (Issue, error) {
	if err := checkKey(key); err != nil {
		return Issue{}, err
	}
	q := url.Values{}
	if fields != nil {
		q.Set("fields", strings.Join(fields, ","))
	}
	p, raw := issuePath(key, "")
	var is Issue
	err := c.do(ctx, request{method: http.MethodGet, path: p, rawPath: raw, query: q, issueKey: key, idempotent: true}, &is)
	return is, err
}

type labelOp struct {
	Add    string `json:"add,omitempty"`
	Remove string `json:"remove,omitempty"`
}

type labelUpdate struct {
	Update struct {
		Labels []labelOp `json:"labels"`
	} `json:"update"`
}

// UpdateLabels adds and removes labels in ONE request: PUT /rest/api/2/issue/{key} with
// {"update":{"labels":[{"add":…},{"remove":…}]}}. Adding a present label or removing an absent
// one is a no-op in Jira, so the call is idempotent and retried like a read. Empty add and remove
// send nothing; a label in both is an error. In dry-run mode the change is logged, not sent.
func (c *Client) UpdateLabels(ctx context.Context, key string, add, remove []string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	add, remove = dedupe(add), dedupe(remove)
	for _, a := range add {
		for _, r := range remove {
			if a == r {
				return fmt.Errorf("jira: update labels of %s: %q is both added and removed", key, a)
			}
		}
	}
	for _, l := range append(append([]string(nil), add...), remove...) {
		if l == "" || strings.ContainsAny(l, " \t\r\n") {
			return fmt.Errorf("jira: update labels of %s: invalid label %q (empty or with spaces)", key, l)
		}
	}
	if len(add) == 0 && len(remove) == 0 {
		return nil
	}
	if c.dryRun {
		c.log.Info().Str("issue_key", key).Strs("add", add).Strs("remove", remove).Bool("dry_run", true).
			Msg("jira: labels not updated (dry run)")
		return nil
	}
	var body labelUpdate
	for _, a := range add {
		body.Update.Labels = append(body.Update.Labels, labelOp{Add: a})
	}
	for _, r := range remove {
		body.Update.Labels = append(body.Update.Labels, labelOp{Remove: r})
	}
	p, raw := issuePath(key, "")
	err := c.do(ctx, request{method: http.MethodPut, path: p, rawPath: raw, body: body, issueKey: key, idempotent: true}, nil)
	if err != nil {
		return err
	}
	c.log.Info().Str("issue_key", key).Strs("add", add).Strs("remove", remove).Msg("jira: labels updated")
	return nil
}

type visibility struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type commentBody struct {
	Body       string      `json:"body"`
	Visibility *visibility `json:"visibility,omitempty"`
}

// AddComment posts a comment (wiki markup text): POST /rest/api/2/issue/{key}/comment. With
// Options.CommentGroup the comment is visible to that group only. It is not retried after a
// 5xx other than 503, as Jira may have stored it. In dry-run mode it is logged, not sent.
func (c *Client) AddComment(ctx context.Context, key, body string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if strings.TrimSpace(body) == "" {
		return fmt.Errorf("jira: comment on %s: empty body", key)
	}
	if c.dryRun {
		c.log.Info().Str("issue_key", key).Int("comment_len", len(body)).Str("comment", truncate([]byte(body), 200)).
			Bool("dry_run", true).Msg("jira: comment not posted (dry run)")
		return nil
	}
	cb := commentBody{Body: body}
	if c.commentGroup != "" {
		cb.Visibility = &visibility{Type: "group", Value: c.commentGroup}
	}
	p, raw := issuePath(key, "/comment")
	if err := c.do(ctx, request{method: http.MethodPost, path: p, rawPath: raw, body: cb, issueKey: key}, nil); err != nil {
		return err
	}
	c.log.Info().Str("issue_key", key).Int("comment_len", len(body)).Msg("jira: comment posted")
	return nil
}

type changelogPage struct {
	StartAt    int              `json:"startAt"`
	MaxResults int              `json:"maxResults"`
	Total      int              `json:"total"`
	IsLast     *bool            `json:"isLast"`
	Values     []ChangelogEntry `json:"values"`
}

type issueWithChangelog struct {
	Changelog struct {
		StartAt    int              `json:"startAt"`
		MaxResults int              `json:"maxResults"`
		Total      int              `json:"total"`
		Histories  []ChangelogEntry `json:"histories"`
	} `json:"changelog"`
}

// Changelog returns every history entry of an issue, oldest first. On Jira Cloud it pages
// through GET /rest/api/2/issue/{key}/changelog (startAt, maxResults, isLast); on Server/DC it
// reads GET /rest/api/2/issue/{key}?expand=changelog.
func (c *Client) Changelog(ctx context.Context, key string) ([]ChangelogEntry, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if c.api != APICloud {
		p, raw := issuePath(key, "")
		q := url.Values{"expand": {"changelog"}, "fields": {"summary"}}
		var is issueWithChangelog
		if err := c.do(ctx, request{method: http.MethodGet, path: p, rawPath: raw, query: q, issueKey: key, idempotent: true}, &is); err != nil {
			return nil, err
		}
		return is.Changelog.Histories, nil
	}
	var all []ChangelogEntry
	p, raw := issuePath(key, "/changelog")
	for startAt := 0; ; {
		q := url.Values{"startAt": {strconv.Itoa(startAt)}, "maxResults": {strconv.Itoa(c.pageSize)}}
		var page changelogPage
		if err := c.do(ctx, request{method: http.MethodGet, path: p, rawPath: raw, query: q, issueKey: key, idempotent: true}, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Values...)
		startAt += len(page.Values)
		switch {
		case len(page.Values) == 0:
			return all, nil
		case page.IsLast != nil:
			if *page.IsLast {
				return all, nil
			}
		case page.Total > 0 && startAt >= page.Total:
			return all, nil
		}
	}
}

// LastLabelAdder finds the newest changelog entry that added label to the issue and returns its
// author and time. found is false when no entry added it.
func (c *Client) LastLabelAdder(ctx context.Context, key, label string) (author User, at time.Time, found bool, err error) {
	entries, err := c.Changelog(ctx, key)
	if err != nil {
		return User{}, time.Time{}, false, err
	}
	for _, e := range entries {
		if !e.AddsLabel(label) {
			continue
		}
		// Entries come oldest first; on equal times the later one wins.
		if !found || !e.Created.Before(at) {
			author, at, found = e.Author, e.Created.Time, true
		}
	}
	return author, at, found, nil
}

type groupName struct {
	Name string `json:"name"`
}

// UserGroups returns the names of the groups a user belongs to. On Jira Cloud user is an
// accountId (GET /rest/api/2/user/groups?accountId=…); on Server/DC a username
// (GET /rest/api/2/user?username=…&expand=groups). Use User.ID to pick the right one.
func (c *Client) UserGroups(ctx context.Context, user string) ([]string, error) {
	if strings.TrimSpace(user) == "" {
		return nil, errors.New("jira: user groups: empty user")
	}
	var names []string
	if c.api == APICloud {
		var groups []groupName
		q := url.Values{"accountId": {user}}
		if err := c.do(ctx, request{method: http.MethodGet, path: "/rest/api/2/user/groups", query: q, idempotent: true}, &groups); err != nil {
			return nil, err
		}
		for _, g := range groups {
			names = append(names, g.Name)
		}
		return names, nil
	}
	var u struct {
		Groups struct {
			Items []groupName `json:"items"`
		} `json:"groups"`
	}
	q := url.Values{"username": {user}, "expand": {"groups"}}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/rest/api/2/user", query: q, idempotent: true}, &u); err != nil {
		return nil, err
	}
	for _, g := range u.Groups.Items {
		names = append(names, g.Name)
	}
	return names, nil
}

// Myself returns the authenticated user (GET /rest/api/2/myself): a cheap start-up check of
// JIRA_URL and the credentials.
func (c *Client) Myself(ctx context.Context) (User, error) {
	var u User
	err := c.do(ctx, request{method: http.MethodGet, path: "/rest/api/2/myself", idempotent: true}, &u)
	return u, err
}

// dedupe drops duplicates and surrounding spaces, keeping the first occurrence's position.
func dedupe(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	seen := make(map[string]bool, len(in))
	out := make([]string, 0, len(in))
	for _, s := range in {
		s = strings.TrimSpace(s)
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
