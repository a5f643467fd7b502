package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/httpsrv"
	"github.com/ymirflow/ymirflow/pipeline"
)

// Idle keep-alive connections to the metrics and health server are closed, not kept
// for as long as clients like.
func TestHealthServerClosesIdleConnections(t *testing.T) {
	// Not parallel: it times the server's idle timeout.
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := pipeline.Health{Metrics: pipeline.NewMetrics(nil), Redis: e.rdb,
		Limits: httpsrv.Limits{IdleTimeout: 200 * time.Millisecond}}.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := httpsrv.IdleClosed(addr.String(), "/healthz", 500, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
