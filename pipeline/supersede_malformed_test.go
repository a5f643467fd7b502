package pipeline_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
)

// malformedEntries are raw triage entries for RHEL-5 that the dead-letter middleware
// refuses (DESIGN §6's bad inputs), each of which names the issue in its issue_key
// field: a read-ahead watch that trusted the raw fields would take it for a newer
// event of the issue.
func malformedEntries(t *testing.T) map[string]map[string]any {
	t.Helper()
	good := func() map[string]any {
		task, err := event.ParseTask([]byte(`{"metadata":{"issue":"RHEL-5"}}`))
		if err != nil {
			t.Fatal(err)
		}
		msg, err := event.New(event.TriageRequested, "RHEL-5", task, nil)
		if err != nil {
			t.Fatal(err)
		}
		vals, err := event.Marshaller{}.Marshal("", msg)
		if err != nil {
			t.Fatal(err)
		}
		return vals
	}
	out := map[string]map[string]any{}
	v := good()
	v[event.MetaPrefix+event.MetaEventType] = "no.such.event"
	out["unknown event type"] = v
	v = good()
	v[event.MetaPrefix+event.MetaEventType] = event.RebaseRequested
	out["another agent's event type"] = v
	v = good()
	v["payload"] = `["not", "an", "object"]`
	out["payload not an object"] = v
	v = good()
	v[event.MetaPrefix+event.MetaSchemaVersion] = "99"
	out["unknown schema version"] = v
	v = good()
	v[event.MetaPrefix+"pad"] = strings.Repeat("x", event.DefaultMaxEventBytes)
	out["oversized"] = v
	v = good()
	for i := range event.MaxEventFields {
		v[event.MetaPrefix+"f"+strconv.Itoa(i)] = "v"
	}
	out["too many fields"] = v
	v = good()
	delete(v, "_watermill_message_uuid")
	out["no uuid"] = v
	return out
}

// Issue 34, item 4: a malformed entry read ahead by the subscription whose handler runs
// its issue under supersede is not a newer event: the run is left to finish (its
// stage.done, no lock.superseded) and the entry is dead-lettered after it. Before, the
// read-ahead watch read the raw issue_key and event_type fields and cancelled the run
// for an entry that was then dead-lettered.
func TestSupersedeReadAheadMalformedEntryDoesNotSupersede(t *testing.T) {
	t.Parallel()
	for name, vals := range malformedEntries(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			first := startFirstHeld(ctx, t, e, func(msg *message.Message) error {
				// Hold the issue until the malformed entry waits in this subscription's
				// read-ahead (delivered, not acked), then for a while longer: the watch
				// looks every 50 ms and, before the fix, cancelled the run within one
				// look. Nothing observable says the watch looked and passed, so the
				// run gives it 500 ms (ten looks) before finishing.
				deadline := time.Now().Add(10 * time.Second)
				for e.pending(e.triage()) < 2 && msg.Context().Err() == nil && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				select {
				case <-msg.Context().Done():
					return context.Cause(msg.Context())
				case <-time.After(500 * time.Millisecond):
					return nil
				}
			})
			bad, err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: vals}).Result()
			if err != nil {
				t.Fatal(err)
			}
			redistest.Eventually(t, 10*time.Second, func() bool {
				return len(e.dead()) == 1 && len(e.results(event.StageDone)) == 1 && e.pending(e.triage()) == 0
			}, "the run finished and the malformed entry was dead-lettered")
			if sup := supersededRecords(e); len(sup) != 0 {
				t.Fatalf("lock.superseded records %v: a malformed entry superseded the run", sup)
			}
			if done := e.results(event.StageDone)[0]; done.Values["message_id"] != first {
				t.Fatalf("stage.done of %v, want the first event's %s", done.Values["message_id"], first)
			}
			if got := e.dead()[0].Values[event.DeadFieldID]; got != bad {
				t.Fatalf("dead letter of %v, want the malformed entry %s", got, bad)
			}
		})
	}
}

// A malformed entry and then a good newer event wait together in the holder's
// read-ahead: the good one supersedes the run (the record names it, never the
// malformed entry, which comes first in the read-ahead) and runs; the malformed one is
// dead-lettered.
func TestSupersedeReadAheadSkipsMalformedForTheNewerGoodEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := startFirstHeld(ctx, t, e, nil)
	bad := malformedEntries(t)["unknown event type"]
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: bad}).Err(); err != nil {
		t.Fatal(err)
	}
	second := e.publishTriage("RHEL-5")
	redistest.Eventually(t, 10*time.Second, func() bool {
		return len(e.dead()) == 1 && len(e.results(event.StageDone)) == 1 && e.pending(e.triage()) == 0
	}, "the good newer event ran and the malformed entry was dead-lettered")
	if rec, ok := supersededRecords(e)[first]; !ok || rec.Values["holder_message_id"] != second {
		t.Fatalf("lock.superseded of the first run %v, want it to name the good newer event %s", rec.Values, second)
	}
	if done := e.results(event.StageDone)[0]; done.Values["message_id"] != second {
		t.Fatalf("stage.done of %v, want %s", done.Values["message_id"], second)
	}
}
