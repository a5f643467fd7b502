package ratelimit_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/ratelimit"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]ratelimit.Rate{
		"5/s":      {N: 5, Per: time.Second},
		" 30 / h ": {N: 30, Per: time.Hour},
		"100/m":    {N: 100, Per: time.Minute},
		"10/30s":   {N: 10, Per: 30 * time.Second},
		"1/24h":    {N: 1, Per: 24 * time.Hour},
	} {
		got, err := ratelimit.ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

// Bad rates are refused with a message that says what is wrong: a rate of 0, a
// negative one, an unparsable one.
func TestParseRateRefuses(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":         "not N/UNIT",
		"5":        "not N/UNIT",
		"0/s":      "at least 1",
		"-5/s":     "at least 1",
		"five/s":   "not a whole number",
		"1.5/s":    "not a whole number",
		"5/week":   "not s, m, h",
		"5/0s":     "above 0",
		"5/-1s":    "above 0",
		"5/48h":    "at most 24h",
		"2000/1ms": "more than one per microsecond",
	} {
		_, err := ratelimit.ParseRate(in)
		if err == nil || !errors.Is(err, ratelimit.ErrBadRate) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRate(%q) = %v; want ErrBadRate saying %q", in, err, want)
		}
	}
	if err := (ratelimit.Rate{N: 5, Per: time.Second}).Check(); err == nil || !strings.Contains(err.Error(), "burst") {
		t.Errorf("a burst of 0 accepted: %v", err)
	}
}

func TestRateString(t *testing.T) {
	t.Parallel()
	if s := (ratelimit.Rate{N: 30, Per: time.Hour, Burst: 1}).String(); s != "30/h (burst 1)" {
		t.Errorf("String = %q", s)
	}
	if d := (ratelimit.Rate{N: 5, Per: time.Second}).Interval(); d != 200*time.Millisecond {
		t.Errorf("Interval = %s", d)
	}
}
