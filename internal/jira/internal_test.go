package jira

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{" 0 ", 0, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"Wed, 01 Jan 2025 12:00:07 GMT", 7 * time.Second, true},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBackoffGrowsWithJitterAndCap(t *testing.T) {
	t.Parallel()
	c := &Client{baseDelay: 100 * time.Millisecond, maxDelay: time.Second}
	for attempt, full := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
		for range 50 {
			d := c.backoff(attempt)
			if d < full/2 || d > full {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", attempt, d, full/2, full)
			}
		}
	}
}

func TestSleepCtxRefusesToOutliveDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := sleepCtx(ctx, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 40*time.Millisecond {
		t.Fatalf("sleepCtx = %v after %s", err, time.Since(start))
	}
}

func TestHTTPErrorBodyTruncated(t *testing.T) {
	t.Parallel()
	e := newHTTPError("GET", "/x", 500, []byte(strings.Repeat("é", 2000)))
	if len(e.Body) > maxErrorBody+len("…") || !strings.HasSuffix(e.Body, "…") {
		t.Fatalf("body not truncated: %d bytes", len(e.Body))
	}
	if errors.Unwrap(e) != nil || !e.Retryable() {
		t.Fatalf("500: Unwrap %v, Retryable %v", errors.Unwrap(e), e.Retryable())
	}
	e = newHTTPError("PUT", "/y", 400, []byte(`{"errorMessages":["bad"],"errors":{"labels":"no spaces","a":"first"}}`))
	if got := e.Error(); got != "jira: PUT /y: 400 Bad Request: bad; a: first; labels: no spaces" {
		t.Fatalf("Error() = %q", got)
	}
}

// An idle limiter lets a burst through at once and paces the rest one per interval
// (issue 35: at burst 1, a webhook delivery's second Jira call waited a full interval).
func TestIdleLimiterLetsABurstThrough(t *testing.T) {
	t.Parallel()
	c, err := New(Options{BaseURL: "http://jira.example", Token: "t"}) // the defaults: 5/s
	if err != nil {
		t.Fatal(err)
	}
	l := c.limit
	if l.burst != 5 || l.interval != 200*time.Millisecond {
		t.Fatalf("default limiter: burst %d, interval %s; want 5 at 200ms", l.burst, l.interval)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 5 {
		if d := l.reserve(t0); d != 0 {
			t.Fatalf("idle limiter: request %d waits %s, want 0", i+1, d)
		}
	}
	for i, want := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond} {
		if d := l.reserve(t0); d != want {
			t.Fatalf("request %d of a burst of 5: waits %s, want %s", 6+i, d, want)
		}
	}
	// Idle again for long enough: a whole burst, not more.
	t1 := t0.Add(5 * time.Second)
	for i := range 5 {
		if d := l.reserve(t1); d != 0 {
			t.Fatalf("after idling: request %d waits %s, want 0", i+1, d)
		}
	}
	if d := l.reserve(t1); d != 200*time.Millisecond {
		t.Fatalf("after idling: request 6 waits %s, want 200ms", d)
	}
	// Sustained: one per interval.
	one := &limiter{interval: 30 * time.Millisecond, burst: 1}
	for i := range 4 {
		if d, want := one.reserve(t0), time.Duration(i)*30*time.Millisecond; d != want {
			t.Fatalf("burst 1: request %d waits %s, want %s", i+1, d, want)
		}
	}
	var nilLimiter *limiter
	if err := nilLimiter.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{RateBurst: -1}); err == nil || !strings.Contains(err.Error(), "RateBurst") {
		t.Fatalf("negative RateBurst: %v", err)
	}
}
