package redistest

import (
	"os"
	"strconv"
	"testing"
)

// ModelSeeds is the seeds a model checker runs, read the same way by every package's
// TestModel… (and scripts/explore): MODEL_SEED (default 1) on, MODEL_SEEDS of them
// (default def; one when MODEL_SEED alone is set). A value that is not a positive
// number fails t, naming the variable.
func ModelSeeds(t testing.TB, def int) (from, n int) {
	t.Helper()
	from, n = 1, def
	if v, ok := seedVar(t, "MODEL_SEED"); ok {
		from, n = v, 1
	}
	if v, ok := seedVar(t, "MODEL_SEEDS"); ok {
		n = v
	}
	return from, n
}

func seedVar(t testing.TB, name string) (int, bool) {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive number", name, s)
	}
	return v, true
}
