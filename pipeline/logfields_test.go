package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// A line the stream subscriber logs names its stream and consumer once each: the
// subscriber adds them itself, so the router hands it its logger without them (a JSON
// line with a key twice is one that log tools read either way).
func TestSubscriberLinesNameStreamOnce(t *testing.T) {
	t.Parallel()
	_, ns := redistest.Client(t)
	opts, err := pipeline.ClientOptions(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewUniversalClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	locker, err := lease.New(rdb, lease.Options{Scope: ns})
	if err != nil {
		t.Fatal(err)
	}
	var buf testlog.Buffer
	topo := event.Topology{Namespace: ns + "ymir"}
	r, err := pipeline.NewRouter(pipeline.RouterConfig{Client: rdb, ClientOptions: opts, Topology: topo,
		Agent: "triage", Consumer: "w1", BlockTime: 50 * time.Millisecond, Locker: locker, Logger: zerolog.New(&buf),
		Handler: func(*message.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-r.Running()
	stream := topo.Stream("triage", "", false)
	// The stream deleted under the reader: its next read finds no group, and the
	// subscriber logs that it created the group again.
	redistest.Eventually(t, 10*time.Second, func() bool {
		_ = rdb.Del(context.Background(), stream).Err()
		return len(buf.Messages("the consumer group was gone")) > 0
	}, "the subscriber logs the group created again")
	line := buf.Messages("the consumer group was gone")[0]
	for _, key := range []string{`"stream":`, `"consumer":`} {
		if n := strings.Count(line, key); n != 1 {
			t.Errorf("%s %d times in %s", key, n, line)
		}
	}
}
