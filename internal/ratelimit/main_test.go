package ratelimit_test

import (
	"os"
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// TestMain runs the re-executed child of the process tests (process_test.go), or pings
// the shared test Redis once and runs the tests.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	redistest.Main(m)
}
