package audit_test

import (
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// TestMain pings the shared test Redis once: with it down, the package fails at once with
// one line naming the URL and how to start a server, instead of every test and example
// failing or hanging on its own.
func TestMain(m *testing.M) { redistest.Main(m) }
