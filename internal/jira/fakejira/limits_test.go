package fakejira_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// fakejira's server closes idle keep-alive connections.
func TestServerClosesIdleConnections(t *testing.T) {
	t.Parallel()
	s := fakejira.New(fakejira.Options{Limits: httpsrv.Limits{IdleTimeout: 200 * time.Millisecond}})
	url := s.Start()
	t.Cleanup(s.Close)
	if err := httpsrv.IdleClosed(strings.TrimPrefix(url, "http://"), "/rest/api/2/myself", 300, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
