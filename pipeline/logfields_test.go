package pipeline_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/testlog"
)

// A line the stream subscriber logs names its stream and consumer once each: the
// subscriber adds them itself, so the router hands it its logger without them (a JSON
// line with a key twice is one that log tools read either way).
func TestSubscriberLinesNameStreamOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var buf testlog.Buffer
	e.start(ctx, routerOpts{Logger: zerolog.New(&buf)}, func(*message.Message) error { return nil })
	// The stream deleted under the reader: its next read finds no group, and the
	// subscriber logs that it created the group again.
	redistest.Eventually(t, 10*time.Second, func() bool {
		_ = e.rdb.Del(context.Background(), e.triage()).Err()
		return len(buf.Messages("the consumer group was gone")) > 0
	}, "the subscriber logs the group created again")
	line := buf.Messages("the consumer group was gone")[0]
	for _, key := range []string{`"stream":`, `"consumer":`} {
		if n := strings.Count(line, key); n != 1 {
			t.Errorf("%s %d times in %s", key, n, line)
		}
	}
}
