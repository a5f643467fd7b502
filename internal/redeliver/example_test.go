package redeliver_test

import (
	"errors"
	"fmt"

	"github.com/ymirflow/ymirflow/internal/redeliver"
)

// A handler whose dependency is down marks its error transient: the pipeline then
// leaves the event pending for redelivery instead of dead-lettering it.
func Example() {
	down := errors.New("jira: 503 Service Unavailable")
	err := errors.Join(redeliver.ErrTransient, fmt.Errorf("triage of RHEL-1: %w", down))
	fmt.Println(errors.Is(err, redeliver.ErrTransient), errors.Is(err, down))
	// Output: true true
}
