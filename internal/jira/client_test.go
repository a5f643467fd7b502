package jira_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// newPair starts a fakejira server and a client for it. Unless set, the client gets a token,
// no rate limit and 1 ms retry delays so retries are fast.
func newPair(t *testing.T, fo fakejira.Options, co jira.Options) (*fakejira.Server, *jira.Client) {
	t.Helper()
	srv := fakejira.New(fo)
	co.BaseURL = srv.Start()
	t.Cleanup(srv.Close)
	if co.Token == "" {
		co.Token = "test-token"
	}
	if co.RateLimit == 0 {
		co.RateLimit = -1
	}
	if co.RetryBaseDelay == 0 {
		co.RetryBaseDelay = time.Millisecond
	}
	c, err := jira.New(co)
	if err != nil {
		t.Fatalf("jira.New: %v", err)
	}
	return srv, c
}

func seedIssues(n int) []fakejira.Issue {
	out := make([]fakejira.Issue, n)
	for i := range out {
		out[i] = fakejira.Issue{Key: fmt.Sprintf("RHEL-%d", i+1), Summary: fmt.Sprintf("issue %d", i+1)}
	}
	return out
}

func keys(issues []jira.Issue) []string {
	var out []string
	for _, is := range issues {
		out = append(out, is.Key)
	}
	return out
}

func countRequests(srv *fakejira.Server, method, path string) int {
	n := 0
	for _, r := range srv.Requests() {
		if r.Method == method && r.Path == path {
			n++
		}
	}
	return n
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		opts jira.Options
		want string
	}{
		{"bad scheme", jira.Options{BaseURL: "ftp://jira", Token: "x"}, "jira: BaseURL:"},
		{"no host", jira.Options{BaseURL: "https://", Token: "x"}, "jira: BaseURL:"},
		{"credentials in URL", jira.Options{BaseURL: "https://bob:s3cret@jira.example.com", Token: "x"}, "jira: BaseURL:"},
		{"no token", jira.Options{BaseURL: "https://jira.example.com"}, "jira: Token:"},
		{"bad api", jira.Options{BaseURL: "https://jira.example.com", Token: "x", API: "v9"}, "jira: API:"},
		{"negative timeout", jira.Options{BaseURL: "https://jira.example.com", Token: "x", Timeout: -time.Second}, "jira: Timeout:"},
		{"NaN rate", jira.Options{BaseURL: "https://jira.example.com", Token: "x", RateLimit: math.NaN()}, "jira: RateLimit:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jira.New(tc.opts)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("New() error = %v, want prefix %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestNewDefaultsAndAPIAuto(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, api, want string }{
		{"https://example.atlassian.net/", "", jira.APICloud},
		{"https://jira.example.com/jira", "", jira.APIServer},
		{"https://jira.example.com", "cloud", jira.APICloud},
		{"https://example.atlassian.net", "server", jira.APIServer},
	} {
		c, err := jira.New(jira.Options{BaseURL: tc.url, Token: "t", API: tc.api})
		if err != nil {
			t.Fatalf("New(%s): %v", tc.url, err)
		}
		if c.API() != tc.want {
			t.Errorf("New(%s, API=%q).API() = %s, want %s", tc.url, tc.api, c.API(), tc.want)
		}
		if c.DryRun() {
			t.Errorf("New(%s).DryRun() = true", tc.url)
		}
	}
	c, err := jira.New(jira.Options{})
	if err != nil {
		t.Fatalf("New without BaseURL: %v", err)
	}
	if !c.DryRun() {
		t.Error("a client without BaseURL must be dry-run")
	}
}

func TestSearchCloudPaging(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(7)}, jira.Options{API: jira.APICloud, PageSize: 3})
	ctx := context.Background()

	var got []string
	req := jira.SearchRequest{JQL: "project = RHEL", Fields: []string{"labels", "summary"}}
	pages := 0
	for {
		p, err := c.Search(ctx, req)
		if err != nil {
			t.Fatalf("Search: %v", err)
		}
		pages++
		got = append(got, keys(p.Issues)...)
		if p.Total != -1 {
			t.Errorf("cloud page Total = %d, want -1", p.Total)
		}
		if p.IsLast {
			if p.NextPageToken != "" {
				t.Errorf("last page has a token %q", p.NextPageToken)
			}
			break
		}
		if p.NextPageToken == "" {
			t.Fatal("non-last page without nextPageToken")
		}
		req.PageToken = p.NextPageToken
	}
	want := keys(toJira(seedIssues(7)))
	if !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("paged %d times to %v, want 3 pages of %v", pages, got, want)
	}
	if n := countRequests(srv, http.MethodPost, "/rest/api/3/search/jql"); n != 3 {
		t.Fatalf("POST /rest/api/3/search/jql %d times, want 3", n)
	}

	got = nil
	if err := c.SearchAll(ctx, "project = RHEL", nil, 0, func(is jira.Issue) error {
		got = append(got, is.Key)
		if is.Fields.Summary == "" {
			t.Errorf("%s: default fields lack summary", is.Key)
		}
		return nil
	}); err != nil {
		t.Fatalf("SearchAll: %v", err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("SearchAll = %v, want %v", got, want)
	}
}

func toJira(in []fakejira.Issue) []jira.Issue {
	out := make([]jira.Issue, len(in))
	for i, is := range in {
		out[i] = jira.Issue{Key: is.Key}
	}
	return out
}

func TestSearchServerPaging(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(8)}, jira.Options{PageSize: 3})
	if c.API() != jira.APIServer {
		t.Fatalf("API() = %s for a loopback URL, want server", c.API())
	}
	ctx := context.Background()
	var got []string
	req := jira.SearchRequest{JQL: "project = RHEL"}
	for pages := 1; ; pages++ {
		p, err := c.Search(ctx, req)
		if err != nil {
			t.Fatalf("Search: %v", err)
		}
		if p.Total != 8 || p.StartAt != req.StartAt {
			t.Fatalf("page %d: total %d startAt %d, want 8 and %d", pages, p.Total, p.StartAt, req.StartAt)
		}
		got = append(got, keys(p.Issues)...)
		if p.IsLast {
			if pages != 3 {
				t.Fatalf("%d pages, want 3", pages)
			}
			break
		}
		req.StartAt = p.NextStartAt
	}
	want := keys(toJira(seedIssues(8)))
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	// SearchAll with a limit stops early and asks only for what it needs.
	got = nil
	before := countRequests(srv, http.MethodPost, "/rest/api/2/search")
	err := c.SearchAll(ctx, "x", nil, 5, func(is jira.Issue) error { got = append(got, is.Key); return nil })
	if err != nil {
		t.Fatalf("SearchAll: %v", err)
	}
	if !slices.Equal(got, want[:5]) {
		t.Fatalf("SearchAll(max 5) = %v", got)
	}
	if n := countRequests(srv, http.MethodPost, "/rest/api/2/search") - before; n != 2 {
		t.Fatalf("SearchAll(max 5) made %d requests, want 2", n)
	}

	// ErrStop ends the walk without error; another error comes back as is.
	got = nil
	err = c.SearchAll(ctx, "x", nil, 0, func(is jira.Issue) error {
		got = append(got, is.Key)
		if len(got) == 4 {
			return jira.ErrStop
		}
		return nil
	})
	if err != nil || len(got) != 4 {
		t.Fatalf("SearchAll with ErrStop: err %v, %d issues", err, len(got))
	}
	boom := errors.New("boom")
	if err := c.SearchAll(ctx, "x", nil, 0, func(jira.Issue) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("SearchAll callback error = %v, want boom", err)
	}
}

func TestAuthHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("basic", func(t *testing.T) {
		srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1), Email: "bot@example.com", Token: "api-tok"},
			jira.Options{Email: "bot@example.com", Token: "api-tok"})
		if _, err := c.GetIssue(ctx, "RHEL-1", nil); err != nil {
			t.Fatalf("GetIssue: %v", err)
		}
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte("bot@example.com:api-tok"))
		if got := srv.Requests()[0].Authorization; got != want {
			t.Fatalf("Authorization = %q, want %q", got, want)
		}
	})
	t.Run("bearer", func(t *testing.T) {
		srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1), Token: "pat-123"}, jira.Options{Token: "pat-123"})
		if _, err := c.GetIssue(ctx, "RHEL-1", nil); err != nil {
			t.Fatalf("GetIssue: %v", err)
		}
		if got := srv.Requests()[0].Authorization; got != "Bearer pat-123" {
			t.Fatalf("Authorization = %q, want Bearer pat-123", got)
		}
	})
}

func TestTypedErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("401", func(t *testing.T) {
		srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1), Token: "right"}, jira.Options{Token: "wrong"})
		_, err := c.Search(ctx, jira.SearchRequest{JQL: "x"})
		var he *jira.HTTPError
		if !errors.Is(err, jira.ErrUnauthorized) || !errors.As(err, &he) || he.StatusCode != 401 {
			t.Fatalf("err = %v, want ErrUnauthorized inside an *HTTPError 401", err)
		}
		if he.Method != http.MethodPost || he.Path != "/rest/api/2/search" || !strings.Contains(he.Body, "not authenticated") {
			t.Fatalf("HTTPError = %+v", he)
		}
		if n := len(srv.Requests()); n != 1 {
			t.Fatalf("a 401 was sent %d times, want 1 (no retry)", n)
		}
	})
	t.Run("403", func(t *testing.T) {
		srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{})
		srv.FailNext(1, http.StatusForbidden, "")
		err := c.UpdateLabels(ctx, "RHEL-1", []string{"a"}, nil)
		var he *jira.HTTPError
		if !errors.Is(err, jira.ErrForbidden) || !errors.As(err, &he) || he.StatusCode != 403 || he.Method != http.MethodPut {
			t.Fatalf("err = %v, want ErrForbidden inside an *HTTPError 403 on PUT", err)
		}
		if errors.Is(err, jira.ErrNotFound) || errors.Is(err, jira.ErrUnauthorized) {
			t.Fatalf("403 matches another sentinel: %v", err)
		}
	})
	t.Run("404", func(t *testing.T) {
		srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{})
		_, err := c.GetIssue(ctx, "RHEL-999", nil)
		var he *jira.HTTPError
		if !errors.Is(err, jira.ErrNotFound) || !errors.As(err, &he) || he.Path != "/rest/api/2/issue/RHEL-999" {
			t.Fatalf("err = %v, want ErrNotFound for /rest/api/2/issue/RHEL-999", err)
		}
		if len(he.Messages) == 0 || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("Jira's errorMessages not surfaced: %v", err)
		}
		if n := len(srv.Requests()); n != 1 {
			t.Fatalf("a 404 was sent %d times, want 1", n)
		}
	})
}

func TestRetry429HonoursRetryAfter(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(2)}, jira.Options{})
	srv.FailNext(1, http.StatusTooManyRequests, "1")
	start := time.Now()
	p, err := c.Search(context.Background(), jira.SearchRequest{JQL: "x"})
	if err != nil {
		t.Fatalf("Search after one 429: %v", err)
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Fatalf("retried after %s, want Retry-After: 1 honoured (>= 1 s)", took)
	}
	if len(p.Issues) != 2 || len(srv.Requests()) != 2 {
		t.Fatalf("%d issues after %d requests, want 2 and 2", len(p.Issues), len(srv.Requests()))
	}
}

func TestRetry429HTTPDate(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{})
	// An HTTP date in the past means "now".
	srv.FailNext(2, http.StatusTooManyRequests, time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat))
	start := time.Now()
	if _, err := c.GetIssue(context.Background(), "RHEL-1", nil); err != nil {
		t.Fatalf("GetIssue after two 429s: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %s", took)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
}

func TestRetry5xxThenSuccess(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{})
	srv.FailNext(1, http.StatusBadGateway, "")
	srv.FailNext(1, http.StatusInternalServerError, "")
	srv.FailNext(1, http.StatusServiceUnavailable, "")
	if err := c.UpdateLabels(context.Background(), "RHEL-1", []string{"ymir_todo"}, nil); err != nil {
		t.Fatalf("UpdateLabels after three 5xx: %v", err)
	}
	if n := countRequests(srv, http.MethodPut, "/rest/api/2/issue/RHEL-1"); n != 4 {
		t.Fatalf("%d PUTs, want 4", n)
	}
	if got := srv.Labels("RHEL-1"); !slices.Equal(got, []string{"ymir_todo"}) {
		t.Fatalf("labels = %v", got)
	}
}

func TestRetriesExhausted(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{MaxRetries: 2})
	srv.FailNext(10, http.StatusServiceUnavailable, "")
	_, err := c.GetIssue(context.Background(), "RHEL-1", nil)
	var he *jira.HTTPError
	if !errors.As(err, &he) || he.StatusCode != 503 || he.Attempts != 3 {
		t.Fatalf("err = %v (%+v), want 503 after 3 attempts", err, he)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Fatalf("%d requests, want 3 (1 + MaxRetries 2)", n)
	}

	// A permanent 429 ends as ErrRateLimited.
	srv2, c2 := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{MaxRetries: 1})
	srv2.FailNext(10, http.StatusTooManyRequests, "")
	if _, err := c2.GetIssue(context.Background(), "RHEL-1", nil); !errors.Is(err, jira.ErrRateLimited) {
		t.Fatalf("err = %v, want ErrRateLimited", err)
	}

	// Negative MaxRetries: no retry at all.
	srv3, c3 := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{MaxRetries: -1})
	srv3.FailNext(1, http.StatusBadGateway, "")
	if _, err := c3.GetIssue(context.Background(), "RHEL-1", nil); err == nil || len(srv3.Requests()) != 1 {
		t.Fatalf("err = %v after %d requests, want an error after 1", err, len(srv3.Requests()))
	}
}

func TestNoSleepPastContextDeadline(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{})
	srv.FailNext(1, http.StatusTooManyRequests, "30")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.GetIssue(ctx, "RHEL-1", nil)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("returned after %s; must not wait for a Retry-After past the deadline", took)
	}
	if !errors.Is(err, jira.ErrRateLimited) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrRateLimited and DeadlineExceeded", err)
	}

	// Cancelling during a backoff returns promptly too.
	srv.FailNext(1, http.StatusTooManyRequests, "20")
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.GetIssue(ctx2, "RHEL-1", nil); done <- err }()
	waitFor(t, 5*time.Second, func() bool { return len(srv.Requests()) >= 2 })
	cancel2()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("GetIssue did not return after cancel")
	}

	// A Retry-After beyond MaxRetryAfter is not waited for.
	srv2, c2 := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{MaxRetryAfter: time.Second})
	srv2.FailNext(1, http.StatusTooManyRequests, "3600")
	start = time.Now()
	if _, err := c2.GetIssue(context.Background(), "RHEL-1", nil); !errors.Is(err, jira.ErrRateLimited) || time.Since(start) > time.Second {
		t.Fatalf("err = %v after %s, want an immediate ErrRateLimited", err, time.Since(start))
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestUpdateLabelsOnePut(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	srv, c := newPair(t, fakejira.Options{
		Issues: []fakejira.Issue{{Key: "RHEL-7", Labels: []string{"keep", "ymir_todo"}}},
		Clock:  func() time.Time { return now },
	}, jira.Options{})
	err := c.UpdateLabels(context.Background(), "RHEL-7", []string{"ymir_triage_in_progress"}, []string{"ymir_todo"})
	if err != nil {
		t.Fatalf("UpdateLabels: %v", err)
	}
	w := srv.Writes()
	if len(w) != 1 || w[0].Method != http.MethodPut || w[0].Key != "RHEL-7" ||
		!slices.Equal(w[0].Add, []string{"ymir_triage_in_progress"}) || !slices.Equal(w[0].Remove, []string{"ymir_todo"}) {
		t.Fatalf("writes = %+v, want one PUT adding in_progress and removing todo", w)
	}
	if got := srv.Labels("RHEL-7"); !slices.Equal(got, []string{"keep", "ymir_triage_in_progress"}) {
		t.Fatalf("labels = %v", got)
	}
	is, err := c.GetIssue(context.Background(), "RHEL-7", []string{"labels", "updated"})
	if err != nil {
		t.Fatal(err)
	}
	if !is.Fields.Updated.Equal(now) {
		t.Fatalf("updated = %v, want %v", is.Fields.Updated, now)
	}
	// The fake recorded the change in the changelog, by its current user.
	author, at, found, err := c.LastLabelAdder(context.Background(), "RHEL-7", "ymir_triage_in_progress")
	if err != nil || !found || author.ID() != fakejira.DefaultUser.AccountID || !at.Equal(now) {
		t.Fatalf("LastLabelAdder = %+v %v %v %v", author, at, found, err)
	}

	// Nothing to do sends nothing; contradictory or malformed input is refused before sending.
	before := len(srv.Requests())
	if err := c.UpdateLabels(context.Background(), "RHEL-7", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateLabels(context.Background(), "RHEL-7", []string{"a"}, []string{"a"}); err == nil {
		t.Fatal("add and remove of one label accepted")
	}
	if err := c.UpdateLabels(context.Background(), "RHEL-7", []string{"two words"}, nil); err == nil {
		t.Fatal("label with a space accepted")
	}
	if err := c.UpdateLabels(context.Background(), "../x", []string{"a"}, nil); err == nil {
		t.Fatal("bad key accepted")
	}
	if n := len(srv.Requests()) - before; n != 0 {
		t.Fatalf("%d requests sent for no-op or invalid updates", n)
	}
}

func TestAddComment(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{CommentGroup: "Red Hat Employee"})
	if err := c.AddComment(context.Background(), "RHEL-1", "Ymir picked up your request"); err != nil {
		t.Fatalf("AddComment: %v", err)
	}
	cs := srv.Comments("RHEL-1")
	if len(cs) != 1 || cs[0].Body != "Ymir picked up your request" || cs[0].Visibility != "Red Hat Employee" {
		t.Fatalf("comments = %+v", cs)
	}
	if w := srv.Writes(); len(w) != 1 || w[0].Comment != cs[0].Body || w[0].Method != http.MethodPost {
		t.Fatalf("writes = %+v", w)
	}
	if err := c.AddComment(context.Background(), "RHEL-1", "  "); err == nil {
		t.Fatal("empty comment accepted")
	}
	// A 500 after a POST may have stored the comment: it is not retried. A 503 is.
	srv.FailNext(1, http.StatusInternalServerError, "")
	if err := c.AddComment(context.Background(), "RHEL-1", "x"); err == nil {
		t.Fatal("500 on a comment did not fail")
	}
	srv.FailNext(1, http.StatusServiceUnavailable, "")
	if err := c.AddComment(context.Background(), "RHEL-1", "y"); err != nil {
		t.Fatalf("503 then success: %v", err)
	}
	if got := len(srv.Comments("RHEL-1")); got != 2 {
		t.Fatalf("%d comments, want 2", got)
	}
}

func labelChange(id string, who jira.User, at time.Time, from, to string) jira.ChangelogEntry {
	return jira.ChangelogEntry{ID: id, Author: who, Created: jira.Time{Time: at},
		Items: []jira.ChangeItem{{Field: "labels", FieldType: "jira", FromString: from, ToString: to}}}
}

func TestChangelogPagingAndLastLabelAdder(t *testing.T) {
	t.Parallel()
	alice := jira.User{AccountID: "acc-alice", DisplayName: "Alice"}
	bob := jira.User{AccountID: "acc-bob", DisplayName: "Bob"}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var hist []jira.ChangelogEntry
	for i := range 230 { // noise, spread over three pages of 100
		hist = append(hist, jira.ChangelogEntry{ID: fmt.Sprint(i), Author: alice, Created: jira.Time{Time: t0.Add(time.Duration(i) * time.Minute)},
			Items: []jira.ChangeItem{{Field: "summary", FromString: "a", ToString: "b"}}})
	}
	// Alice adds ymir_todo (page 1), removes it, Bob re-adds it on page 3; a later entry changes
	// another label only.
	hist[10] = labelChange("10", alice, t0.Add(10*time.Minute), "x", "x ymir_todo")
	hist[150] = labelChange("150", alice, t0.Add(150*time.Minute), "x ymir_todo", "x")
	hist[220] = labelChange("220", bob, t0.Add(220*time.Minute), "x", "ymir_todo x")
	hist[225] = labelChange("225", alice, t0.Add(225*time.Minute), "ymir_todo x", "ymir_todo x other")

	srv, c := newPair(t, fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-5", Changelog: hist}}},
		jira.Options{API: jira.APICloud})
	entries, err := c.Changelog(context.Background(), "RHEL-5")
	if err != nil {
		t.Fatalf("Changelog: %v", err)
	}
	if len(entries) != 230 || entries[229].ID != "229" {
		t.Fatalf("%d entries, want 230 in order", len(entries))
	}
	if n := countRequests(srv, http.MethodGet, "/rest/api/2/issue/RHEL-5/changelog"); n != 3 {
		t.Fatalf("%d changelog pages fetched, want 3", n)
	}
	author, at, found, err := c.LastLabelAdder(context.Background(), "RHEL-5", "ymir_todo")
	if err != nil || !found || author.AccountID != "acc-bob" || !at.Equal(t0.Add(220*time.Minute)) {
		t.Fatalf("LastLabelAdder = %+v %v %v %v, want Bob at +220m", author, at, found, err)
	}
	// Newest by time, not by position.
	srv.AddIssues(fakejira.Issue{Key: "RHEL-6", Changelog: []jira.ChangelogEntry{
		labelChange("2", alice, t0.Add(time.Hour), "", "ymir_todo"),
		labelChange("1", bob, t0, "", "ymir_todo"),
	}})
	if author, _, _, _ := c.LastLabelAdder(context.Background(), "RHEL-6", "ymir_todo"); author.AccountID != "acc-alice" {
		t.Fatalf("LastLabelAdder picked %+v, want the newest (alice)", author)
	}
	if _, _, found, err := c.LastLabelAdder(context.Background(), "RHEL-5", "never_added"); found || err != nil {
		t.Fatalf("LastLabelAdder(never_added) found=%v err=%v", found, err)
	}
	if _, _, _, err := c.LastLabelAdder(context.Background(), "RHEL-404", "ymir_todo"); !errors.Is(err, jira.ErrNotFound) {
		t.Fatalf("LastLabelAdder on a missing issue: %v", err)
	}
}

func TestChangelogServer(t *testing.T) {
	t.Parallel()
	bob := jira.User{Name: "bob"}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	srv, c := newPair(t, fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-5", Changelog: []jira.ChangelogEntry{
		labelChange("1", bob, t0, "", "ymir_todo"),
	}}}}, jira.Options{})
	author, _, found, err := c.LastLabelAdder(context.Background(), "RHEL-5", "ymir_todo")
	if err != nil || !found || author.ID() != "bob" {
		t.Fatalf("LastLabelAdder = %+v %v %v", author, found, err)
	}
	r := srv.Requests()
	if len(r) != 1 || r[0].Path != "/rest/api/2/issue/RHEL-5" || !strings.Contains(r[0].RawQuery, "expand=changelog") {
		t.Fatalf("requests = %+v, want one GET issue?expand=changelog", r)
	}
}

func TestUserGroups(t *testing.T) {
	t.Parallel()
	groups := map[string][]string{"acc-1": {"Red Hat Employee", "jira-users"}, "bob": {"jira-users"}}
	ctx := context.Background()
	_, cloud := newPair(t, fakejira.Options{Groups: groups}, jira.Options{API: jira.APICloud})
	got, err := cloud.UserGroups(ctx, "acc-1")
	if err != nil || !slices.Equal(got, []string{"Red Hat Employee", "jira-users"}) {
		t.Fatalf("cloud UserGroups = %v, %v", got, err)
	}
	if _, err := cloud.UserGroups(ctx, "acc-unknown"); !errors.Is(err, jira.ErrNotFound) {
		t.Fatalf("unknown user: %v, want ErrNotFound", err)
	}
	srv, server := newPair(t, fakejira.Options{Groups: groups}, jira.Options{})
	got, err = server.UserGroups(ctx, "bob")
	if err != nil || !slices.Equal(got, []string{"jira-users"}) {
		t.Fatalf("server UserGroups = %v, %v", got, err)
	}
	if r := srv.Requests(); r[0].Path != "/rest/api/2/user" || !strings.Contains(r[0].RawQuery, "username=bob") {
		t.Fatalf("server asked %+v", r[0])
	}
	if _, err := server.UserGroups(ctx, ""); err == nil {
		t.Fatal("empty user accepted")
	}
}

func TestMyself(t *testing.T) {
	t.Parallel()
	me := jira.User{AccountID: "acc-bot", DisplayName: "bot"}
	_, c := newPair(t, fakejira.Options{CurrentUser: me}, jira.Options{})
	got, err := c.Myself(context.Background())
	if err != nil || got != me {
		t.Fatalf("Myself = %+v, %v", got, err)
	}
}

func TestIssueKeepsUnknownFields(t *testing.T) {
	t.Parallel()
	updated := time.Date(2024, 5, 1, 10, 20, 30, 0, time.UTC)
	_, c := newPair(t, fakejira.Options{Issues: []fakejira.Issue{{
		Key: "RHEL-3", Summary: "s", Status: "In Progress", Labels: []string{"l1"}, Updated: updated,
		Components: []string{"openssl"}, FixVersions: []string{"rhel-9.6"},
		Fields: map[string]any{"customfield_10669": "perl:5.32/perl", "priority": map[string]string{"name": "Major"}},
	}}}, jira.Options{})
	is, err := c.GetIssue(context.Background(), "RHEL-3", nil)
	if err != nil {
		t.Fatal(err)
	}
	f := is.Fields
	if f.Summary != "s" || f.Status.Name != "In Progress" || !slices.Equal(f.Labels, []string{"l1"}) ||
		!f.Updated.Equal(updated) || f.Components[0].Name != "openssl" || f.FixVersions[0].Name != "rhel-9.6" {
		t.Fatalf("fields = %+v", f)
	}
	var dc string
	if ok, err := f.Field("customfield_10669", &dc); !ok || err != nil || dc != "perl:5.32/perl" {
		t.Fatalf("customfield_10669 = %q %v %v", dc, ok, err)
	}
	if ok, _ := f.Field("customfield_missing", &dc); ok {
		t.Fatal("missing field reported present")
	}
	var whole map[string]json.RawMessage
	if err := json.Unmarshal(is.Raw, &whole); err != nil || whole["self"] == nil {
		t.Fatalf("Raw is not the whole issue: %s", is.Raw)
	}
	// Re-encoding keeps the unknown fields and the typed changes.
	is.Fields.Labels = append(is.Fields.Labels, "l2")
	b, err := json.Marshal(is)
	if err != nil {
		t.Fatal(err)
	}
	var back jira.Issue
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	var prio struct{ Name string }
	if ok, _ := back.Fields.Field("priority", &prio); !ok || prio.Name != "Major" || !slices.Equal(back.Fields.Labels, []string{"l1", "l2"}) {
		t.Fatalf("round trip lost data: %s", b)
	}
	if !back.HasLabel("l2") || back.HasLabel("l3") {
		t.Fatal("HasLabel")
	}
}

func TestDryRunSendsNoWrite(t *testing.T) {
	t.Parallel()
	srv, c := newPair(t, fakejira.Options{Issues: seedIssues(2)}, jira.Options{DryRun: true})
	ctx := context.Background()
	if err := c.UpdateLabels(ctx, "RHEL-1", []string{"ymir_triage_in_progress"}, []string{"ymir_todo"}); err != nil {
		t.Fatal(err)
	}
	if err := c.AddComment(ctx, "RHEL-1", "hello"); err != nil {
		t.Fatal(err)
	}
	if w := srv.Writes(); len(w) != 0 {
		t.Fatalf("dry run wrote %+v", w)
	}
	for _, r := range srv.Requests() {
		if r.Method != http.MethodGet {
			t.Fatalf("dry run sent %s %s", r.Method, r.Path)
		}
	}
	// Reads still go to Jira.
	if p, err := c.Search(ctx, jira.SearchRequest{JQL: "x"}); err != nil || len(p.Issues) != 2 {
		t.Fatalf("dry-run search: %v", err)
	}

	// Without a BaseURL: writes are logged, reads say why they cannot work.
	off, err := jira.New(jira.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.UpdateLabels(ctx, "RHEL-1", []string{"a"}, nil); err != nil {
		t.Fatalf("offline write: %v", err)
	}
	if _, err := off.Search(ctx, jira.SearchRequest{JQL: "x"}); !errors.Is(err, jira.ErrNotConfigured) {
		t.Fatalf("offline search: %v, want ErrNotConfigured", err)
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	const rate, burst, n = 20.0, 2, 6
	_, c := newPair(t, fakejira.Options{Issues: seedIssues(1)}, jira.Options{RateLimit: rate, RateBurst: burst})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n { // concurrent callers share one limiter
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Search(context.Background(), jira.SearchRequest{JQL: "x"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	minimum := time.Duration(float64(n-burst) / rate * float64(time.Second)) // 200 ms: the burst goes at once
	if took := time.Since(start); took < minimum-10*time.Millisecond {
		t.Fatalf("%d searches at %v/s took %s, want at least %s", n, rate, took, minimum)
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	want := time.Date(2024, 5, 1, 10, 20, 30, 0, time.UTC)
	for _, s := range []string{
		"2024-05-01T10:20:30.000+0000",
		"2024-05-01T12:20:30.000+0200",
		"2024-05-01T06:20:30.000-0400",
		"2024-05-01T10:20:30.000",
		"2024-05-01T10:20:30",
		"2024-05-01T10:20:30Z",
		"2024-05-01T10:20:30.000+00:00",
	} {
		got, err := jira.ParseTime(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if got, err := jira.ParseTime("2024-05-01T10:20:30.123+0000"); err != nil || got.Nanosecond() != 123e6 {
		t.Errorf("milliseconds lost: %v %v", got, err)
	}
	for _, bad := range []string{"", "garbage", "2024-13-01T00:00:00.000+0000", "yesterday"} {
		if _, err := jira.ParseTime(bad); err == nil {
			t.Errorf("ParseTime(%q) accepted", bad)
		}
	}

	var v struct {
		A, B, C jira.Time
	}
	if err := json.Unmarshal([]byte(`{"A":"2024-05-01T10:20:30.000+0000","B":null,"C":""}`), &v); err != nil {
		t.Fatal(err)
	}
	if !v.A.Equal(want) || !v.B.IsZero() || !v.C.IsZero() {
		t.Fatalf("decoded %+v", v)
	}
	b, _ := json.Marshal(v)
	if string(b) != `{"A":"2024-05-01T10:20:30.000+0000","B":null,"C":null}` {
		t.Fatalf("encoded %s", b)
	}
	if err := json.Unmarshal([]byte(`{"A":"not a time"}`), &v); err == nil {
		t.Fatal("bad time decoded")
	}
}

func TestChangeItemLabels(t *testing.T) {
	t.Parallel()
	it := jira.ChangeItem{Field: "labels", FromString: "a b", ToString: "b c d"}
	if got := it.AddedLabels(); !slices.Equal(got, []string{"c", "d"}) {
		t.Errorf("AddedLabels = %v", got)
	}
	if got := it.RemovedLabels(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("RemovedLabels = %v", got)
	}
	if got := (jira.ChangeItem{Field: "summary", ToString: "x"}).AddedLabels(); got != nil {
		t.Errorf("summary change reports labels %v", got)
	}
}

// flaky wraps a handler; the first n requests get bad, the rest reach next.
func flaky(n int, bad, next http.Handler) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n--
		first := n >= 0
		mu.Unlock()
		if first {
			bad.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func TestNetworkErrorAndAttemptTimeoutAreRetried(t *testing.T) {
	t.Parallel()
	srv := fakejira.New(fakejira.Options{Issues: seedIssues(1)})
	cut := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // the connection dies mid-request
		}
	})
	hang := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Never answers; the client's attempt timeout must fire. (The body is drained first so
		// that the server notices the client hanging up and cancels r.Context.)
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	for name, bad := range map[string]http.Handler{"cut": cut, "hang": hang} {
		t.Run(name, func(t *testing.T) {
			hs := httptest.NewServer(flaky(1, bad, srv))
			defer hs.Close()
			c, err := jira.New(jira.Options{BaseURL: hs.URL, Token: "t", RateLimit: -1,
				RetryBaseDelay: time.Millisecond, Timeout: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.GetIssue(context.Background(), "RHEL-1", nil); err != nil {
				t.Fatalf("GetIssue after a %s attempt: %v", name, err)
			}
			// A comment is not retried after a network error: it may have been stored.
			hs2 := httptest.NewServer(flaky(1, bad, srv))
			defer hs2.Close()
			c2, _ := jira.New(jira.Options{BaseURL: hs2.URL, Token: "t", RateLimit: -1,
				RetryBaseDelay: time.Millisecond, Timeout: 200 * time.Millisecond})
			if err := c2.AddComment(context.Background(), "RHEL-1", "hi"); err == nil {
				t.Fatalf("AddComment after a %s attempt succeeded; it must not be retried", name)
			}
		})
	}
	if n := len(srv.Comments("RHEL-1")); n != 0 {
		t.Fatalf("%d comments stored", n)
	}
}
