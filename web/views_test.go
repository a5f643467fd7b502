package web_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// The console tells the truth: a running worker is alive from its own presence beat,
// even with nothing to do; the timeline has one line per event with milliseconds and
// entry ids, and a drop names its reason; groups with nothing pending take one line.
func TestConsoleShowsPresenceReasonsAndOneLinePerEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id := e.publish("RHEL-8")
	e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.topo.Results(), Values: map[string]any{
		"event_type": event.LockDropped, "agent": "triage", "issue_key": "RHEL-8", "stream": e.topo.Stream("triage", "", false),
		"message_id": id, "holder": "", "holder_fence": "0", "holder_message_id": "1-1", "reason": "superseded"}})
	e.start(ctx, func(*message.Message) error { return nil })

	_, body := e.get("/?fragment=1")
	alive := regexp.MustCompile(`<td>w1-0</td><td>` + regexp.QuoteMeta(e.topo.Stream("triage", "", false)) +
		`</td><td class="num">\d+</td><td class="num">[^<]*</td><td><span class="badge ok" title="[^"]+ pid \d+">alive</span>`)
	if !alive.MatchString(body) || strings.Contains(body, `badge bad`) {
		t.Errorf("overview does not show w1-0 alive:\n%s", body)
	}

	_, body = e.get("/issue?key=rhel-8&fragment=1")
	stamp := regexp.MustCompile(`<td class="nowrap">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z</td><td class="nowrap">` + regexp.QuoteMeta(id) + `</td>`)
	if !stamp.MatchString(body) || !strings.Contains(body, "superseded by entry 1-1") || strings.Contains(body, "held by") ||
		!strings.Contains(body, `<span class="badge">superseded</span>`) {
		t.Errorf("timeline:\n%s", body)
	}
	// The hand-made record is in no index: the page says its stream was scanned.
	if !strings.Contains(body, `<p class="note" id="scanned">Not in the index: scanned 1 entries older than the per-issue index`) {
		t.Errorf("timeline does not say what it scanned:\n%s", body)
	}

	// The one entry is acked soon after the router starts; then no group has anything
	// pending and none gets a section of its own.
	redistest.Eventually(t, 10*time.Second, func() bool {
		_, body = e.get("/pending?fragment=1")
		return strings.Contains(body, `id="empty-groups"`) && !strings.Contains(body, "<section")
	}, "pending page with every group collapsed")
	if !strings.Contains(body, "Nothing pending in 2 group(s)") {
		t.Errorf("pending:\n%s", body)
	}
}
