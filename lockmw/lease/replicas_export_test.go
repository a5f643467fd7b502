package lease

// NotReplicatedError is notReplicatedError, for the tests of package lease_test.
type NotReplicatedError = notReplicatedError
