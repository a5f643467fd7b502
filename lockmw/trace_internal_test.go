package lockmw

import (
	"context"
	"errors"
	"testing"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// With tracing off (no recording span in the context) the lease's span events cost no
// allocation: the router benchmark's off path is unchanged.
func TestLeaseSpanEventsAllocateNothingWhenOff(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	ctx := context.Background()
	lost := errors.New("x")
	if n := testing.AllocsPerRun(100, func() {
		leaseAcquired(ctx, nil, false)
		leaseConflict(ctx, "dropped", "locked", lease.Info{})
		leaseEnded(ctx, lost)
	}); n != 0 {
		t.Fatalf("%v allocations per event with tracing off, want 0", n)
	}
}

func TestLeaseErrorTypes(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]string{
		lease.ErrLeaseLost: "lease_lost", lease.ErrLeaseUnproven: "lease_unproven", lease.ErrMaxHold: "max_hold",
		lease.ErrInvalidKey: "invalid_key", &lease.LockedError{}: "locked", &lease.SupersededError{}: "superseded", errors.New("x"): "",
	} {
		if got := LeaseErrorType(errors.Join(errors.New("wrapped"), err)); got != want {
			t.Errorf("LeaseErrorType(%v) = %q, want %q", err, got, want)
		}
	}
}
