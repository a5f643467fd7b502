package lease

import "context"

// Abandon stops the lease's heartbeat without releasing it: what a worker's SIGKILL
// leaves behind (its keys expire by their TTL). For the tests of package lease_test.
func (le *Lease) Abandon() { le.stopHeartbeat() }

// FinishedForTest ends a wait lease whose event ran to its end (what Handoff does for
// it): release, record that it ran, hand the key to the line's head, ack e.
func (le *Lease) FinishedForTest(ctx context.Context, e Entry) error { return le.finishLine(ctx, e) }
