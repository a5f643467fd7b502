package event

// Accepts is accepts, for the tests of package event_test.
var Accepts = accepts
