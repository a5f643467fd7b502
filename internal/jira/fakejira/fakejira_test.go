package fakejira_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

const issuesJSON = `[
  {"id": "501", "key": "RHEL-10", "fields": {
     "summary": "openssl CVE", "labels": ["ymir_todo"], "updated": "2024-05-01T10:20:30.000+0000",
     "status": {"name": "New"}, "components": [{"name": "openssl"}], "fixVersions": [{"name": "rhel-9.6"}],
     "customfield_10669": "openssl"},
   "changelog": {"histories": [
     {"id": "1", "author": {"accountId": "acc-1"}, "created": "2024-04-30T09:00:00.000+0000",
      "items": [{"field": "labels", "fromString": "", "toString": "ymir_todo"}]}]}},
  {"key": "RHEL-11", "fields": {"labels": [], "updated": "2024-05-01T10:20:30.000", "status": {"name": "Closed"}}}
]`

func do(t *testing.T, method, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "issues.json")
	if err := os.WriteFile(path, []byte(issuesJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	issues, err := fakejira.LoadFile(path)
	if err != nil {
		t.Fatalf("LoadFile: %v", err)
	}
	if len(issues) != 2 {
		t.Fatalf("%d issues", len(issues))
	}
	a := issues[0]
	if a.Key != "RHEL-10" || a.ID != "501" || a.Status != "New" || !slices.Equal(a.Labels, []string{"ymir_todo"}) ||
		!a.Updated.Equal(time.Date(2024, 5, 1, 10, 20, 30, 0, time.UTC)) || a.Components[0] != "openssl" ||
		a.FixVersions[0] != "rhel-9.6" || len(a.Changelog) != 1 || a.Changelog[0].Author.AccountID != "acc-1" {
		t.Fatalf("issue 0 = %+v", a)
	}
	if !issues[1].Updated.Equal(time.Date(2024, 5, 1, 10, 20, 30, 0, time.UTC)) {
		t.Fatalf("naive updated not read as UTC: %v", issues[1].Updated)
	}

	// Served back, the issue keeps its custom field and changelog.
	srv := fakejira.New(fakejira.Options{Issues: issues})
	url := srv.Start()
	defer srv.Close()
	code, _, body := do(t, "GET", url+"/rest/api/2/issue/rhel-10?expand=changelog", "")
	if code != 200 {
		t.Fatalf("GET issue: %d %s", code, body)
	}
	var got jira.Issue
	var cl struct {
		Changelog struct{ Histories []jira.ChangelogEntry } `json:"changelog"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, &cl); err != nil {
		t.Fatal(err)
	}
	var dc string
	if ok, _ := got.Fields.Field("customfield_10669", &dc); !ok || dc != "openssl" || len(cl.Changelog.Histories) != 1 {
		t.Fatalf("served %s", body)
	}

	// A saved search response is accepted too; garbage is not.
	if is, err := fakejira.ParseIssues([]byte(`{"issues":[{"key":"A-1","fields":{}}]}`)); err != nil || len(is) != 1 {
		t.Fatalf("ParseIssues(search response) = %v, %v", is, err)
	}
	for _, bad := range []string{`{}`, `[{"fields":{}}]`, `nope`, `[{"key":"A-1","fields":{"updated":"yesterday"}}]`} {
		if _, err := fakejira.ParseIssues([]byte(bad)); err == nil {
			t.Errorf("ParseIssues(%s) accepted", bad)
		}
	}
	if _, err := fakejira.LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("LoadFile(missing) accepted")
	}
}

func TestHandlerMountedAndEndpoints(t *testing.T) {
	t.Parallel()
	srv := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{
		{Key: "A-1", Summary: "one", Labels: []string{"x"}, Fields: map[string]any{"customfield_1": 7}},
		{Key: "A-2"},
	}})
	hs := httptest.NewServer(srv) // Server is an http.Handler
	defer hs.Close()

	// Field selection.
	code, _, body := do(t, "GET", hs.URL+"/rest/api/2/search?jql=x&fields=labels,-summary", "")
	if code != 200 || strings.Contains(string(body), `"summary"`) || !strings.Contains(string(body), `"labels":["x"]`) ||
		strings.Contains(string(body), "customfield_1") || !strings.Contains(string(body), `"total":2`) {
		t.Fatalf("GET search: %d %s", code, body)
	}
	// Cloud removed /rest/api/3/search.
	if code, _, _ := do(t, "POST", hs.URL+"/rest/api/3/search", `{"jql":"x"}`); code != http.StatusGone {
		t.Fatalf("POST /rest/api/3/search = %d, want 410", code)
	}
	// A bad cursor is a 400.
	if code, _, _ := do(t, "POST", hs.URL+"/rest/api/3/search/jql", `{"jql":"x","nextPageToken":"bogus"}`); code != 400 {
		t.Fatalf("bad token = %d, want 400", code)
	}
	// fields.labels sets; other update fields are refused; bad labels are refused.
	if code, _, b := do(t, "PUT", hs.URL+"/rest/api/2/issue/A-1", `{"fields":{"labels":["p","q"]}}`); code != 204 {
		t.Fatalf("PUT fields.labels = %d %s", code, b)
	}
	if got := srv.Labels("A-1"); !slices.Equal(got, []string{"p", "q"}) {
		t.Fatalf("labels = %v", got)
	}
	if code, _, _ := do(t, "PUT", hs.URL+"/rest/api/2/issue/A-1", `{"update":{"summary":[{"set":"x"}]}}`); code != 400 {
		t.Fatalf("PUT update.summary = %d, want 400", code)
	}
	if code, _, _ := do(t, "PUT", hs.URL+"/rest/api/2/issue/A-1", `{"update":{"labels":[{"add":"a b"}]}}`); code != 400 {
		t.Fatalf("PUT label with space = %d, want 400", code)
	}
	if w := srv.Writes(); len(w) != 1 || !slices.Equal(w[0].Set, []string{"p", "q"}) {
		t.Fatalf("writes = %+v", w)
	}
	// An ADF comment body (API v3) is kept as its JSON.
	if code, _, b := do(t, "POST", hs.URL+"/rest/api/3/issue/A-2/comment", `{"body":{"type":"doc","version":1,"content":[]}}`); code != 201 {
		t.Fatalf("POST ADF comment = %d %s", code, b)
	}
	if c := srv.Comments("A-2"); len(c) != 1 || !strings.Contains(c[0].Body, `"type":"doc"`) {
		t.Fatalf("comments = %+v", c)
	}
	if code, _, _ := do(t, "POST", hs.URL+"/rest/api/2/issue/A-2/comment", `{"body":""}`); code != 400 {
		t.Fatalf("empty comment = %d, want 400", code)
	}
	if code, _, b := do(t, "GET", hs.URL+"/rest/api/2/issue/A-2/comment", ""); code != 200 || !strings.Contains(string(b), `"total":1`) {
		t.Fatalf("GET comments = %d %s", code, b)
	}
	if code, _, _ := do(t, "GET", hs.URL+"/nope", ""); code != 404 {
		t.Fatalf("unknown path = %d", code)
	}
	if code, _, _ := do(t, "DELETE", hs.URL+"/rest/api/2/issue/A-1", ""); code != 405 {
		t.Fatalf("DELETE issue = %d, want 405", code)
	}
	if _, ok := srv.Issue("A-404"); ok || srv.Labels("A-404") != nil {
		t.Fatal("unknown issue found")
	}
}

func TestFailNextAndAuth(t *testing.T) {
	t.Parallel()
	srv := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{{Key: "A-1"}}, Token: "pat"})
	url := srv.Start()
	defer srv.Close()
	if again := srv.Start(); again != url || srv.URL() != url {
		t.Fatalf("Start twice: %s then %s", url, again)
	}
	auth := []string{"Authorization", "Bearer pat"}
	srv.FailNext(2, 429, "7")
	srv.FailNext(1, 502, "")
	var got []string
	for range 4 {
		code, h, _ := do(t, "GET", url+"/rest/api/2/issue/A-1", "", auth...)
		got = append(got, fmt.Sprint(code, h.Get("Retry-After")))
	}
	if want := []string{"4297", "4297", "502", "200"}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if code, h, _ := do(t, "GET", url+"/rest/api/2/issue/A-1", ""); code != 401 || h.Get("WWW-Authenticate") == "" {
		t.Fatalf("no credentials = %d", code)
	}
	if code, _, _ := do(t, "GET", url+"/rest/api/2/issue/A-1", "", "Authorization", "Bearer wrong"); code != 401 {
		t.Fatalf("wrong token = %d", code)
	}
	r := srv.Requests()
	if len(r) != 6 || r[0].Status != 429 || r[3].Status != 200 || r[3].Authorization != "Bearer pat" {
		t.Fatalf("requests = %+v", r)
	}
}

func TestConcurrentWritesAreSerialised(t *testing.T) {
	t.Parallel()
	srv := fakejira.New(fakejira.Options{Issues: []fakejira.Issue{{Key: "A-1"}}})
	url := srv.Start()
	defer srv.Close()
	c, err := jira.New(jira.Options{BaseURL: url, Token: "t", RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.UpdateLabels(context.Background(), "A-1", []string{fmt.Sprintf("l%02d", i)}, nil); err != nil {
				t.Error(err)
			}
			_ = srv.Labels("A-1")
			_ = srv.Writes()
		}()
	}
	wg.Wait()
	labels := srv.Labels("A-1")
	is, _ := srv.Issue("A-1")
	if len(labels) != n || len(srv.Writes()) != n || len(is.Changelog) != n {
		t.Fatalf("%d labels, %d writes, %d changelog entries; want %d each", len(labels), len(srv.Writes()), len(is.Changelog), n)
	}
	// Each changelog entry's "from" is the previous entry's "to": no lost update.
	for i := 1; i < n; i++ {
		if is.Changelog[i].Items[0].FromString != is.Changelog[i-1].Items[0].ToString {
			t.Fatalf("changelog %d does not follow %d", i, i-1)
		}
	}
}

func TestUserEndpoints(t *testing.T) {
	t.Parallel()
	srv := fakejira.New(fakejira.Options{Groups: map[string][]string{"acc-1": {"g1"}}})
	url := srv.Start()
	defer srv.Close()
	srv.SetGroups("bob", "g2", "g3")
	code, _, b := do(t, "GET", url+"/rest/api/3/user/groups?accountId=acc-1", "")
	if code != 200 || !bytes.Contains(b, []byte(`"name":"g1"`)) {
		t.Fatalf("user/groups = %d %s", code, b)
	}
	code, _, b = do(t, "GET", url+"/rest/api/2/user?username=bob&expand=groups", "")
	if code != 200 || !bytes.Contains(b, []byte(`"size":2`)) || !bytes.Contains(b, []byte(`"name":"bob"`)) {
		t.Fatalf("user = %d %s", code, b)
	}
	if code, _, _ := do(t, "GET", url+"/rest/api/2/user/groups?accountId=nobody", ""); code != 404 {
		t.Fatalf("unknown user = %d", code)
	}
	if code, _, _ := do(t, "GET", url+"/rest/api/2/user/groups", ""); code != 400 {
		t.Fatalf("no user = %d", code)
	}
	code, _, b = do(t, "GET", url+"/rest/api/2/myself", "")
	if code != 200 || !bytes.Contains(b, []byte(fakejira.DefaultUser.AccountID)) {
		t.Fatalf("myself = %d %s", code, b)
	}
}

func ExampleServer() {
	srv := fakejira.New(fakejira.Options{
		Issues: []fakejira.Issue{{Key: "RHEL-1", Labels: []string{"ymir_todo"}}},
		Groups: map[string][]string{"acc-42": {"Red Hat Employee"}},
	})
	defer srv.Close()
	c, err := jira.New(jira.Options{BaseURL: srv.Start(), Token: "any", DryRun: false})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if err := c.UpdateLabels(ctx, "RHEL-1", []string{"ymir_triage_in_progress"}, []string{"ymir_todo"}); err != nil {
		fmt.Println(err)
		return
	}
	for _, w := range srv.Writes() {
		fmt.Println(w.Method, w.Key, "add", w.Add, "remove", w.Remove)
	}
	fmt.Println(srv.Labels("RHEL-1"))
	// Output:
	// PUT RHEL-1 add [ymir_triage_in_progress] remove [ymir_todo]
	// [ymir_triage_in_progress]
}
