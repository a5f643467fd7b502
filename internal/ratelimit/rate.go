package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ErrBadRate is wrapped by ParseRate's and Rate.Check's errors.
var ErrBadRate = errors.New("ratelimit: bad rate")

// MaxPer bounds Rate.Per: a day. A longer period is more likely a typo than a budget.
const MaxPer = 24 * time.Hour

// Rate is a budget: N events per Per, of which Burst may go at once after a quiet spell.
// Over any window T, at most Burst + T×N/Per are permitted.
type Rate struct {
	N     int
	Per   time.Duration
	Burst int
}

// ParseRate reads "N/UNIT": N a positive integer, UNIT s, m or h, or a Go duration
// ("10/30s": 10 per 30 seconds). The burst is left 0 (the caller sets it; Check
// refuses 0).
func ParseRate(s string) (Rate, error) {
	n, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, fmt.Errorf("%w: %q is not N/UNIT (e.g. 5/s, 30/h)", ErrBadRate, s)
	}
	v, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil {
		return Rate{}, fmt.Errorf("%w: %q: the count %q is not a whole number (e.g. 5/s, 30/h)", ErrBadRate, s, n)
	}
	var d time.Duration
	switch p := strings.TrimSpace(per); p {
	case "s", "sec", "second":
		d = time.Second
	case "m", "min", "minute":
		d = time.Minute
	case "h", "hour":
		d = time.Hour
	default:
		if d, err = time.ParseDuration(p); err != nil {
			return Rate{}, fmt.Errorf("%w: %q: the unit %q is not s, m, h or a duration such as 30s", ErrBadRate, s, p)
		}
	}
	r := Rate{N: v, Per: d, Burst: 1}
	if err := r.Check(); err != nil {
		return Rate{}, err
	}
	r.Burst = 0
	return r, nil
}

// Check refuses a rate that permits nothing or cannot be kept: N or Burst below 1, a
// period out of (0, MaxPer], or an interval between events under a microsecond.
func (r Rate) Check() error {
	switch {
	case r.N < 1:
		return fmt.Errorf("%w: %d per %s must be at least 1 (0 would permit nothing)", ErrBadRate, r.N, r.Per)
	case r.Per <= 0 || r.Per > MaxPer:
		return fmt.Errorf("%w: the period %s must be above 0 and at most %s", ErrBadRate, r.Per, MaxPer)
	case r.Per/time.Duration(r.N) < time.Microsecond:
		return fmt.Errorf("%w: %d per %s is more than one per microsecond", ErrBadRate, r.N, r.Per)
	case r.Burst < 1:
		return fmt.Errorf("%w: the burst %d must be at least 1", ErrBadRate, r.Burst)
	case r.Burst > math.MaxInt32:
		return fmt.Errorf("%w: the burst %d is too large", ErrBadRate, r.Burst)
	}
	return nil
}

// Interval is the time between two events at the steady rate.
func (r Rate) Interval() time.Duration { return r.Per / time.Duration(max(r.N, 1)) }

// String is the rate as ParseRate reads it, with the burst: "5/s (burst 5)".
func (r Rate) String() string {
	unit := r.Per.String()
	switch r.Per {
	case time.Second:
		unit = "s"
	case time.Minute:
		unit = "m"
	case time.Hour:
		unit = "h"
	}
	return fmt.Sprintf("%d/%s (burst %d)", r.N, unit, r.Burst)
}
