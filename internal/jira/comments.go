package jira

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

// Comment is one comment of an issue, as GET /rest/api/2/issue/{key}/comment lists it.
type Comment struct {
	ID      string `json:"id"`
	Body    string `json:"body"`
	Author  User   `json:"author"`
	Created Time   `json:"created"`
}

// commentPage is one page of an issue's comments.
type commentPage struct {
	StartAt    int       `json:"startAt"`
	MaxResults int       `json:"maxResults"`
	Total      int       `json:"total"`
	Comments   []Comment `json:"comments"`
}

// maxCommentPages bounds Comments: at most this many pages of 100 are read.
const maxCommentPages = 20

// Comments lists an issue's comments, oldest first: GET /rest/api/2/issue/{key}/comment,
// page by page (100 a page, at most 2 000 comments: an issue with more is read in
// part, its oldest first).
func (c *Client) Comments(ctx context.Context, key string) ([]Comment, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	p, raw := issuePath(key, "/comment")
	var out []Comment
	for range maxCommentPages {
		q := url.Values{"startAt": {strconv.Itoa(len(out))}, "maxResults": {"100"}}
		var page commentPage
		err := c.do(ctx, request{method: http.MethodGet, path: p, rawPath: raw, query: q, issueKey: key, idempotent: true}, &page)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Comments...)
		if len(page.Comments) == 0 || len(out) >= page.Total {
			break
		}
	}
	return out, nil
}
