package jira

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// DefaultFields are the fields Search asks for when SearchRequest.Fields is nil. (Jira Cloud's
// search/jql returns only ids unless told otherwise, so an explicit list keeps both APIs alike.)
var DefaultFields = []string{"summary", "status", "labels", "updated", "created", "components", "fixVersions"}

// SearchRequest is one page request. Set PageToken (Jira Cloud) or StartAt (Jira Server/DC)
// from the previous SearchPage to get the next page.
type SearchRequest struct {
	JQL string
	// Fields to return; nil means DefaultFields. Use []string{"*all"} for everything.
	Fields []string
	// MaxResults per page; 0 means Options.PageSize. Jira may return fewer.
	MaxResults int
	// PageToken is the cursor of the Cloud API (SearchPage.NextPageToken); "" for the first page.
	PageToken string
	// StartAt is the offset of the Server/DC API (SearchPage.NextStartAt); 0 for the first page.
	StartAt int
}

// SearchPage is one page of results.
type SearchPage struct {
	Issues []Issue
	// NextPageToken is the cursor for the next page (Cloud); "" on the last page.
	NextPageToken string
	// StartAt, MaxResults and Total are the Server/DC paging numbers; Total is -1 on Cloud,
	// which does not count.
	StartAt    int
	MaxResults int
	Total      int
	// NextStartAt is the StartAt of the next page (Server/DC).
	NextStartAt int
	// IsLast reports that there is no further page.
	IsLast bool
}

type cloudSearchBody struct {
	JQL           string   `json:"jql"`
	MaxResults    int      `json:"maxResults"`
	Fields        []string `json:"fields"`
	NextPageToken string   `json:"nextPageToken,omitempty"`
}

type cloudSearchResponse struct {
	Issues        []Issue `json:"issues"`
	NextPageToken string  `json:"nextPageToken"`
	IsLast        *bool   `json:"isLast"`
}

type serverSearchBody struct {
	JQL        string   `json:"jql"`
	StartAt    int      `json:"startAt"`
	MaxResults int      `json:"maxResults"`
	Fields     []string `json:"fields"`
}

type serverSearchResponse struct {
	StartAt    int     `json:"startAt"`
	MaxResults int     `json:"maxResults"`
	Total      int     `json:"total"`
	Issues     []Issue `json:"issues"`
}

// Search fetches one page of issues matching req.JQL: POST /rest/api/3/search/jql with
// nextPageToken on Jira Cloud, POST /rest/api/2/search with startAt on Jira Server/DC.
func (c *Client) Search(ctx context.Context, req SearchRequest) (SearchPage, error) {
	fields := req.Fields
	if fields == nil {
		fields = DefaultFields
	}
	size := req.MaxResults
	if size <= 0 {
		size = c.pageSize
	}
	var raw json.RawMessage
	var err error
	if c.api == APICloud {
		err = c.do(ctx, request{
			method: http.MethodPost, path: "/rest/api/3/search/jql", idempotent: true,
			body: cloudSearchBody{JQL: req.JQL, MaxResults: size, Fields: fields, NextPageToken: req.PageToken},
		}, &raw)
	} else {
		err = c.do(ctx, request{
			method: http.MethodPost, path: "/rest/api/2/search", idempotent: true,
			body: serverSearchBody{JQL: req.JQL, StartAt: req.StartAt, MaxResults: size, Fields: fields},
		}, &raw)
	}
	if err != nil {
		return SearchPage{}, err
	}
	p, err := parseSearchPage(c.api, raw, size)
	if err != nil {
		return SearchPage{}, fmt.Errorf("jira: search: decode response: %w", err)
	}
	return p, nil
}

// parseSearchPage decodes one search response of api (APICloud or APIServer) asked
// with maxResults size.
func parseSearchPage(api string, body []byte, size int) (SearchPage, error) {
	if api == APICloud {
		var resp cloudSearchResponse
		if err := json.Unmarshal(body, &resp); err != nil {
			return SearchPage{}, err
		}
		p := SearchPage{Issues: resp.Issues, NextPageToken: resp.NextPageToken, MaxResults: size, Total: -1}
		p.IsLast = resp.NextPageToken == "" || len(resp.Issues) == 0 || (resp.IsLast != nil && *resp.IsLast)
		if p.IsLast {
			p.NextPageToken = ""
		}
		return p, nil
	}
	var resp serverSearchResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return SearchPage{}, err
	}
	p := SearchPage{
		Issues: resp.Issues, StartAt: resp.StartAt, MaxResults: resp.MaxResults, Total: resp.Total,
		NextStartAt: resp.StartAt + len(resp.Issues),
	}
	p.IsLast = len(resp.Issues) == 0 || p.NextStartAt >= resp.Total
	return p, nil
}

// MaxSearchPages bounds one SearchAll walk: a Jira that keeps answering "more" must not
// keep a sweep going for ever.
const MaxSearchPages = 1000

// SearchAll pages through every issue matching jql and calls fn for each, in Jira's order, until
// the results end, maxIssues were delivered (maxIssues <= 0: no limit), or fn returns an error. fn
// returning ErrStop ends the walk with a nil error; any other error is returned as is. An issue
// seen on an earlier page (offsets shift when issues change during a walk) is not delivered
// twice. fields nil means DefaultFields. Offsets (Server/DC) shift when an issue stops matching
// during the walk, so a caller that edits issues out of the JQL should collect them first and
// edit afterwards, as the Python fetcher did.
func (c *Client) SearchAll(ctx context.Context, jql string, fields []string, maxIssues int, fn func(Issue) error) error {
	seen := make(map[string]bool)
	delivered := 0
	req := SearchRequest{JQL: jql, Fields: fields}
	for page := 1; ; page++ {
		if page > MaxSearchPages {
			return fmt.Errorf("%w: stopped after %d pages (%d issues); narrow the JQL", ErrPaging, MaxSearchPages, delivered)
		}
		req.MaxResults = c.pageSize
		if maxIssues > 0 && maxIssues-delivered < req.MaxResults {
			req.MaxResults = maxIssues - delivered
		}
		p, err := c.Search(ctx, req)
		if err != nil {
			return fmt.Errorf("%w (search page %d)", err, page)
		}
		for _, is := range p.Issues {
			if seen[is.Key] {
				continue
			}
			seen[is.Key] = true
			if err := fn(is); err != nil {
				if errors.Is(err, ErrStop) {
					return nil
				}
				return err
			}
			delivered++
			if maxIssues > 0 && delivered >= maxIssues {
				return nil
			}
		}
		if p.IsLast {
			return nil
		}
		if c.api == APICloud {
			if p.NextPageToken == req.PageToken {
				return fmt.Errorf("%w: Jira returned the same nextPageToken twice (page %d)", ErrPaging, page)
			}
			req.PageToken = p.NextPageToken
		} else {
			if p.NextStartAt <= req.StartAt {
				return fmt.Errorf("%w: startAt did not advance past %d (page %d)", ErrPaging, req.StartAt, page)
			}
			req.StartAt = p.NextStartAt
		}
	}
}
