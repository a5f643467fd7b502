package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/pipeline"
)

// The worker's start-up check: a server that persists nothing, or keeps snapshots
// only, is warned about (its restart hands fences out again); with the requirement
// set, it is refused. A server with an append-only file passes quietly.
func TestPersistenceCheckWarnsOrRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    redistest.ServerOptions
		warn string // "" for no warning and no refusal
	}{
		{"nothing", redistest.ServerOptions{}, "persists nothing"},
		{"snapshots only", redistest.ServerOptions{Args: []string{"--save", "3600 1"}}, "only snapshots"},
		{"aof", redistest.ServerOptions{AOF: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.StartServer(t, tc.o).Client()
			ctx := context.Background()
			var buf testlog.Buffer
			p, err := pipeline.CheckPersistence(ctx, rdb, zerolog.New(&buf), false)
			if err != nil {
				t.Fatal(err)
			}
			if p.AOF != (tc.warn == "") {
				t.Errorf("aof = %v", p.AOF)
			}
			if got := buf.String(); (tc.warn == "") != (got == "") || !strings.Contains(got, tc.warn) {
				t.Errorf("log %q, want a warning saying %q", got, tc.warn)
			}
			_, err = pipeline.CheckPersistence(ctx, rdb, zerolog.New(&buf), true)
			if tc.warn == "" && err != nil {
				t.Errorf("required, on a server with AOF: %v", err)
			}
			if tc.warn != "" && (!errors.Is(err, pipeline.ErrNoAOF) || !strings.Contains(err.Error(), tc.warn)) {
				t.Errorf("required: %v, want ErrNoAOF saying %q", err, tc.warn)
			}
		})
	}
}
