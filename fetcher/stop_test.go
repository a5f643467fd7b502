package fetcher

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
)

// SIGTERM (a cancelled ctx) during a sweep stops it between issues: the issue at hand
// is published and flipped, the others are left untouched for the next sweep.
func TestSweepStopsBetweenIssues(t *testing.T) {
	t.Parallel()
	var issues []fakejira.Issue
	for _, k := range []string{"RHEL-1", "RHEL-2", "RHEL-3", "RHEL-4"} {
		issues = append(issues, todoBy(iss(k), member)) // published to :todo, then ymir_todo flipped
	}
	h := newHarness(t, issues)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	var once sync.Once
	h.mu.Lock()
	h.onRequest = func(r *http.Request) {
		if r.Method == http.MethodPut {
			once.Do(cancel) // the first issue's label flip: stop now
		}
	}
	h.mu.Unlock()
	sum, err := h.fetcher().Sweep(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("sweep: %v, want it stopped by the cancellation; requests %v, sum %+v", err, h.requests("", ""), sum)
	}
	if got := h.published(); len(got) != 1 || got[0] != "RHEL-1@todo" {
		t.Fatalf("published %v, want only the issue in hand when the signal came", got)
	}
	if len(h.writes("RHEL-1")) == 0 {
		t.Fatal("RHEL-1 published but its labels not flipped")
	}
	for _, k := range []string{"RHEL-2", "RHEL-3", "RHEL-4"} {
		if w := h.writes(k); len(w) != 0 {
			t.Fatalf("%s touched after the stop: %v", k, w)
		}
	}
	if sum.Published != 1 || sum.Skipped[ReasonError] != 3 {
		t.Fatalf("summary %+v", sum)
	}
	// The next sweep takes the rest.
	h.mu.Lock()
	h.onRequest = nil
	h.mu.Unlock()
	h.sweep()
	if got := h.published(); len(got) != 4 {
		t.Fatalf("after the next sweep: %v", got)
	}
}
