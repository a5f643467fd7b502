package jira_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// recorder is a SharedLimit that records what the client asks of it.
type recorder struct {
	mu        sync.Mutex
	waits     int
	throttles []time.Duration
	waitErr   error
}

func (r *recorder) Wait(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits++
	return r.waitErr
}

func (r *recorder) Throttle(_ context.Context, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.throttles = append(r.throttles, d)
	return nil
}

// Every attempt waits for the shared limit; a 429 pauses it for its Retry-After, or,
// without one, for the backoff delay.
func TestSharedLimitWaitedAndThrottled(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	srv, c := newPair(t, fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1"}}},
		jira.Options{Shared: rec, RetryBaseDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond})
	srv.FailNext(1, http.StatusTooManyRequests, "1")
	srv.FailNext(1, http.StatusTooManyRequests, "")
	srv.FailNext(1, http.StatusServiceUnavailable, "0")
	if _, err := c.GetIssue(context.Background(), "RHEL-1", nil); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.waits != 4 {
		t.Errorf("%d waits for the shared limit, want one per attempt, 4", rec.waits)
	}
	if len(rec.throttles) != 2 || rec.throttles[0] != time.Second || rec.throttles[1] <= 0 || rec.throttles[1] > 10*time.Millisecond {
		t.Errorf("throttles %v; want [1s, the backoff] (a 503 pauses nobody)", rec.throttles)
	}
}

// A failed wait (Redis down, the context ended) fails the request without sending it.
func TestSharedLimitWaitError(t *testing.T) {
	t.Parallel()
	boom := errors.New("redis down")
	srv, c := newPair(t, fakejira.Options{Issues: []fakejira.Issue{{Key: "RHEL-1"}}}, jira.Options{Shared: &recorder{waitErr: boom}})
	_, err := c.GetIssue(context.Background(), "RHEL-1", nil)
	if !errors.Is(err, boom) || len(srv.Requests()) != 0 {
		t.Errorf("err %v, %d requests sent; want the wait's error and none", err, len(srv.Requests()))
	}
}
