package jira_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// FuzzSearchResponse: whatever a Jira (or something posing as one) answers to a search,
// the client neither panics nor loops: SearchAll ends, on both APIs.
func FuzzSearchResponse(f *testing.F) {
	for _, s := range []string{
		`{"startAt":0,"maxResults":2,"total":2,"issues":[{"key":"RHEL-1","fields":{"labels":["a"],"updated":"2024-01-02T03:04:05.000+0000"}},{"key":"RHEL-2"}]}`,
		`{"startAt":0,"maxResults":1,"total":99,"issues":[{"key":"RHEL-1"}]}`,
		`{"issues":[{"key":"RHEL-1","fields":{"status":{"name":"New"},"components":[{"name":"c"}],"customfield_1":{"value":1}}}],"nextPageToken":"t","isLast":false}`,
		`{"startAt":-5,"total":-1,"issues":[{}]}`,
		`{"issues":[{"key":"A-1","fields":{"updated":"not a time","created":12,"labels":"x"}}]}`,
		`[]`, `null`, ``, `{"issues":null,"nextPageToken":""}`,
	} {
		f.Add([]byte(s))
	}
	var mu sync.Mutex
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		b := body
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	f.Cleanup(srv.Close)
	clients := map[string]*jira.Client{}
	for _, api := range []string{jira.APIServer, jira.APICloud} {
		c, err := jira.New(jira.Options{BaseURL: srv.URL, Token: "t", API: api, RateLimit: -1, MaxRetries: -1, PageSize: 2})
		if err != nil {
			f.Fatal(err)
		}
		clients[api] = c
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		mu.Lock()
		body = in
		mu.Unlock()
		for api, c := range clients {
			n := 0
			_ = c.SearchAll(context.Background(), "project = RHEL", nil, 0, func(jira.Issue) error {
				n++
				return nil
			})
			if n > 2*jira.MaxSearchPages {
				t.Fatalf("%s: %d issues delivered from one repeated page", api, n)
			}
		}
	})
}
