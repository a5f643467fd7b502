package lease

// Abandon stops the lease's heartbeat without releasing it: what a worker's SIGKILL
// leaves behind (its keys expire by their TTL). For the tests of package lease_test.
func (le *Lease) Abandon() { le.stopHeartbeat() }
