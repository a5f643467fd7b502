package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// A bad entry read ahead behind another issue's event takes no lease in that event's
// release (the handoff), and the next good event of the bad entry's issue runs:
// nothing is dropped as locked by, or superseded by, a lease that no run used.
func TestBadEntryBehindGoodEventTakesNoLeaseAndNextGoodRuns(t *testing.T) {
	t.Parallel()
	for _, bad := range []struct {
		name   string
		values map[string]any
	}{
		{"schema_version", map[string]any{"_watermill_message_uuid": "u-bad", "m:schema_version": "9",
			"m:issue_key": "RHEL-7", "payload": `{"metadata":{"issue":"RHEL-7"}}`}},
		{"event_type", map[string]any{"_watermill_message_uuid": "u-bad", "m:event_type": "rebase.requested",
			"m:issue_key": "RHEL-7", "payload": `{"metadata":{"issue":"RHEL-7"}}`}},
		{"not JSON", map[string]any{"_watermill_message_uuid": "u-bad", "m:issue_key": "RHEL-7", "payload": `{nope`}},
	} {
		t.Run(bad.name, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var r runs
			release := make(chan struct{})
			e.start(ctx, routerOpts{}, func(msg *message.Message) error {
				if r.Add(issueOf(msg)) == 1 && issueOf(msg) == "RHEL-1" {
					<-release
				}
				return nil
			})
			e.publishTriage("RHEL-1")
			redistest.Eventually(t, 10*time.Second, func() bool { return r.Get("RHEL-1") == 1 }, "first run started")
			badID, err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: bad.values}).Result()
			if err != nil {
				t.Fatal(err)
			}
			// The bad entry is read ahead while the first run goes on; the lease of its
			// issue would be taken in that run's release.
			redistest.Eventually(t, 10*time.Second, func() bool { return e.pending(e.triage()) == 2 }, "bad entry read ahead")
			close(release)
			redistest.Eventually(t, 10*time.Second, func() bool { return len(e.dead()) == 1 }, "bad entry dead-lettered")
			if d := e.dead()[0].Values[event.DeadFieldID]; d != badID {
				t.Fatalf("dead letter is of %v, want the bad entry %s", d, badID)
			}
			lock := e.TriageLocker(3*time.Second).LockKey("triage", "RHEL-7")
			if n := e.rdb.Exists(ctx, lock).Val(); n != 0 {
				t.Fatalf("%s exists after the bad entry was dead-lettered: a lease was taken ahead for it", lock)
			}
			e.publishTriage("RHEL-7")
			redistest.Eventually(t, 10*time.Second, func() bool {
				return r.Get("RHEL-7") == 1 && e.pending(e.triage()) == 0
			}, "the good event after the bad one ran (runs %d)", r.Get("RHEL-7"))
			if drops := e.results(event.LockDropped); len(drops) != 0 {
				t.Fatalf("a good event was dropped: %v", drops[0].Values)
			}
		})
	}
}
