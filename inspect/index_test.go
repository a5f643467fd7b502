package inspect_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// noise appends n entries about other issues to stream, indexed as the pipeline's
// writers index them, in one pipeline.
func (e *env) noise(stream string, n int) {
	e.t.Helper()
	ctx := context.Background()
	pipe := e.Client.Pipeline()
	for i := range n {
		key := fmt.Sprintf("NOISE-%d", i%500+1)
		xonce.Queue(ctx, pipe, xonce.Append{Stream: stream, ID: xonce.NewID(), Issue: key,
			Values: map[string]any{"event_type": "stage.done", "issue_key": key, "agent": "triage"}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// An issue's timeline comes from its index when every record about it was written by
// the pipeline's writers: requests (Publisher), outcomes (Results), drops and dead
// letters (the xonce appends the pipeline makes) are all found among thousands of other
// entries, and nothing is scanned (the report says so: Scanned is nil).
func TestTimelineReadsTheIndexNotTheStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 50)
	c9s := e.Topology.Stream("rebase", "c9s", false)
	e.noise(e.TriageStream(), 10)
	e.noise(e.Topology.Results(), 10)
	var want []string
	want = append(want, e.PublishTriage("RHEL-7"))
	e.noise(e.TriageStream(), 2000)
	rec, err := event.NewResults(e.Client, e.Topology.Results(), 0).Add(ctx, event.Record{EventType: event.StageDone, Agent: "triage", IssueKey: "rhel-7", Outcome: "rebase"})
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, rec)
	e.noise(e.Topology.Results(), 2000)
	want = append(want, e.publishTo(c9s, event.RebaseRequested, "rhel-7"))
	dead, err := xonce.Run(ctx, e.Client, xonce.Append{Stream: e.Topology.Dead(), ID: "d1", Issue: event.IndexIssue("rhel-7"),
		Values: map[string]any{"m:issue_key": "rhel-7", "m:event_type": "rebase.requested", "_watermill_message_uuid": "u",
			event.DeadFieldStream: c9s, event.DeadFieldID: want[2], event.DeadFieldError: "boom", event.DeadFieldAttempts: "3"}})
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, dead)
	e.PublishTriage("RHEL-8")

	rep, err := in.Timeline(ctx, " rhel-7")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, ev := range rep.Events {
		got[ev.ID] = true
		if ev.EventType == event.Dead && !strings.Contains(ev.Detail, "boom") {
			t.Errorf("dead letter = %+v", ev)
		}
	}
	for _, id := range want {
		if !got[id] || len(rep.Events) != len(want) {
			t.Fatalf("timeline = %+v, want ids %v", rep.Events, want)
		}
	}
	if rep.Scanned != nil || rep.Indexed != len(want) {
		t.Fatalf("timeline scanned %+v, indexed %d; want no scan, %d indexed", rep.Scanned, rep.Indexed, len(want))
	}
}

// Entries older than the index (written before it began, or by a writer that does not
// index) are found by scanning only that older part of their stream, and the report
// says so; a stream nothing was ever indexed in is scanned whole.
func TestTimelineScansOnlyWhatIsOlderThanTheIndex(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := e.inspector(nil, 10)
	raw := func(stream string, values map[string]any) string {
		id, err := e.Client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	var want []string
	want = append(want, raw(e.TriageStream(), map[string]any{"m:issue_key": "RHEL-3", "_watermill_message_uuid": "u1", "payload": "{}"}))
	for i := range 24 {
		raw(e.TriageStream(), map[string]any{"m:issue_key": fmt.Sprint("OLD-", i+1), "_watermill_message_uuid": "u", "payload": "{}"})
	}
	want = append(want, raw(e.Topology.Results(), map[string]any{"event_type": "stage.done", "issue_key": "RHEL-3"}))
	want = append(want, e.PublishTriage("RHEL-3")) // the triage stream's index begins here
	e.noise(e.TriageStream(), 300)

	rep, err := in.Timeline(ctx, "RHEL-3")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range rep.Events {
		got = append(got, ev.ID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("timeline ids = %v, want %v", got, want)
	}
	sc := rep.Scanned
	if sc == nil || rep.Indexed != 1 {
		t.Fatalf("scanned %+v, indexed %d; want a scan and one indexed event", sc, rep.Indexed)
	}
	// The triage stream's 25 entries before its index, and the results stream (never
	// indexed) whole: 26 entries, not the 300 after the index began.
	if sc.Entries != 26 || !sc.Whole || len(sc.Streams) != 2 || !strings.Contains(sc.String(), "scanned 26 entries") {
		t.Fatalf("scan = %+v (%s)", sc, sc)
	}
}
