package agentctl_test

import (
	"testing"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
