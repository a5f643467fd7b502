package pipeline_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"

	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline/event"
)

// The event format names, without importing them, what the lock middleware and
// watermill-redisstream name: the metadata keys the middleware reads and writes, and
// the uuid field a stock Watermill publisher writes.
func TestWireNamesAgreeWithLockmwAndWatermill(t *testing.T) {
	for _, c := range []struct{ event, other string }{
		{event.MetaIssueKey, lockmw.MetaIssueKey},
		{event.MetaFence, lockmw.MetaFence},
		{event.FieldUUID, redisstream.UUIDHeaderKey},
	} {
		if c.event != c.other {
			t.Errorf("event says %q, the other side %q", c.event, c.other)
		}
	}
}
