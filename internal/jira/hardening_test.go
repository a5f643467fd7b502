package jira_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// A redirect to another port, or from https to http, is refused and never carries the
// Authorization header there.
func TestRedirectToAnotherOriginRefused(t *testing.T) {
	t.Parallel()
	var leaked atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			leaked.Add(1)
		}
		_, _ = w.Write([]byte(`{"accountId":"x"}`))
	}))
	defer elsewhere.Close()
	redirect := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusFound)
	})
	plain := httptest.NewServer(redirect) // http → http on another port
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(redirect) // https → http
	defer tlsSrv.Close()

	for _, base := range []string{plain.URL, tlsSrv.URL} {
		c, err := jira.New(jira.Options{BaseURL: base, Token: "secret-token", API: jira.APIServer, RateLimit: -1,
			HTTPClient: tlsSrv.Client()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Myself(context.Background()); !errors.Is(err, jira.ErrRedirect) {
			t.Errorf("%s: err %v, want ErrRedirect", base, err)
		}
	}
	if n := leaked.Load(); n != 0 {
		t.Fatalf("the token reached another origin %d times", n)
	}
}

// Server/DC paging that does not advance ends with ErrPaging instead of looping.
func TestSearchAllStopsWhenStartAtDoesNotAdvance(t *testing.T) {
	t.Parallel()
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		// Always the first page, whatever startAt was asked for.
		_ = json.NewEncoder(w).Encode(map[string]any{"startAt": 0, "maxResults": 2, "total": 100,
			"issues": []map[string]any{{"key": "RHEL-1"}, {"key": "RHEL-2"}}})
	}))
	defer srv.Close()
	c, err := jira.New(jira.Options{BaseURL: srv.URL, Token: "t", API: jira.APIServer, RateLimit: -1, PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = c.SearchAll(context.Background(), "project = RHEL", nil, 0, func(jira.Issue) error { n++; return nil })
	if !errors.Is(err, jira.ErrPaging) || !strings.Contains(err.Error(), "did not advance") || n != 2 || requests.Load() != 2 {
		t.Fatalf("err %v, %d issues, %d requests", err, n, requests.Load())
	}
}

// A Jira that always has another page stops at MaxSearchPages.
func TestSearchAllPageCap(t *testing.T) {
	t.Parallel()
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			StartAt int `json:"startAt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		requests.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"startAt": body.StartAt, "maxResults": 1, "total": 1 << 30,
			"issues": []map[string]any{{"key": "RHEL-" + itoa(body.StartAt+1)}}})
	}))
	defer srv.Close()
	c, err := jira.New(jira.Options{BaseURL: srv.URL, Token: "t", API: jira.APIServer, RateLimit: -1, PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = c.SearchAll(context.Background(), "project = RHEL", nil, 0, func(jira.Issue) error { return nil })
	if !errors.Is(err, jira.ErrPaging) || int(requests.Load()) != jira.MaxSearchPages {
		t.Fatalf("err %v after %d requests, want ErrPaging after %d", err, requests.Load(), jira.MaxSearchPages)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
