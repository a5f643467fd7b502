package fakejira_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// Beyond its RateLimit's burst the server answers 429 with Retry-After in whole
// seconds; StartEmpty answers the first request so.
func TestRateLimitAnswers429(t *testing.T) {
	t.Parallel()
	for _, empty := range []bool{false, true} {
		s := fakejira.New(fakejira.Options{RateLimit: fakejira.RateLimit{N: 1, Per: time.Hour, Burst: 2, StartEmpty: empty}})
		url := s.Start()
		var statuses []int
		for range 3 {
			resp, err := http.Get(url + "/rest/api/2/myself")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			statuses = append(statuses, resp.StatusCode)
			if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "3600" {
				t.Errorf("Retry-After %q, want 3600", resp.Header.Get("Retry-After"))
			}
		}
		s.Close()
		want := []int{200, 200, 429}
		if empty {
			want = []int{429, 429, 429}
		}
		for i := range want {
			if statuses[i] != want[i] {
				t.Errorf("StartEmpty %v: statuses %v, want %v", empty, statuses, want)
				break
			}
		}
		if n := len(s.Requests()); n != 3 {
			t.Errorf("%d requests logged, want 3", n)
		}
	}
}
