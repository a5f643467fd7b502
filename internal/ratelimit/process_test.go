package ratelimit_test
const childEnv = "RATELIMIT_TEST_CHILD"
func runChild() int { return 0 }
