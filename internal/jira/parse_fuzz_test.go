package jira

import (
	"testing"
)

// FuzzParseSearchPage: any bytes either fail to decode or give a page whose paging
// fields are consistent, on both APIs (what SearchAll's loop relies on to end).
func FuzzParseSearchPage(f *testing.F) {
	for _, s := range []string{
		`{"startAt":0,"maxResults":2,"total":2,"issues":[{"key":"RHEL-1","fields":{"labels":["a"],"updated":"2024-01-02T03:04:05.000+0000"}},{"key":"RHEL-2"}]}`,
		`{"issues":[{"key":"RHEL-1","fields":{"status":{"name":"New"},"components":[{"name":"c"}],"customfield_1":{"value":1}}}],"nextPageToken":"t","isLast":false}`,
		`{"startAt":9223372036854775807,"total":-1,"issues":[{}]}`,
		`{"issues":[{"key":"A-1","fields":{"updated":"not a time","created":12,"labels":"x"}}]}`,
		`{"issues":[{"fields":{"fixVersions":[{"name":1}],"reporter":{"accountId":[]}}}]}`,
		`null`, `[]`, `{"issues":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if p, err := parseSearchPage(APIServer, body, 50); err == nil {
			if p.NextStartAt != p.StartAt+len(p.Issues) {
				t.Fatalf("server: NextStartAt %d, StartAt %d, %d issues", p.NextStartAt, p.StartAt, len(p.Issues))
			}
			if len(p.Issues) == 0 && !p.IsLast {
				t.Fatal("server: an empty page is not the last")
			}
		}
		if p, err := parseSearchPage(APICloud, body, 50); err == nil {
			if p.IsLast != (p.NextPageToken == "") {
				t.Fatalf("cloud: IsLast %v with token %q", p.IsLast, p.NextPageToken)
			}
			if len(p.Issues) == 0 && !p.IsLast {
				t.Fatal("cloud: an empty page is not the last")
			}
		}
	})
}
