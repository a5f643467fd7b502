package pipeline

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// BenchmarkRouterLockedTraced is BenchmarkRouterLocked with tracing on, into the SDK's
// in-memory exporter through a batch processor (the commands' setup, without the
// network): a consumer span per event, its lease events, and the delivery record
// (SET ... GET) that links a redelivery to the attempt before it. Run with the others
// for the ratio docs/development.md reports ("Measured here"):
//
//	go test -run '^$' -bench 'Router(Bare|Locked|LockedTraced)$' -benchtime 3000x -count 3 -benchmem ./pipeline/
func BenchmarkRouterLockedTraced(b *testing.B) {
	srv := redistest.StartServer(b, redistest.ServerOptions{})
	rdb := srv.Client()
	topo := event.Topology{Namespace: "ymir"}
	stream := topo.Stream("triage", "", false)
	opts, _ := ClientOptions(srv.URL())
	locker, err := lease.New(rdb, lease.Options{})
	if err != nil {
		b.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	var n atomic.Int64
	done, gate := make(chan struct{}), make(chan struct{})
	r, err := NewRouter(RouterConfig{Client: rdb, ClientOptions: opts, Topology: topo, Agent: "triage", Consumer: "bench",
		BlockTime: 100 * time.Millisecond, Locker: locker, TracerProvider: tp,
		Handler: func(*message.Message) error { return count(&n, b.N, gate, done) }})
	if err != nil {
		b.Fatal(err)
	}
	benchConsume(b, rdb, stream, r, gate, done)
}
