package lockmw_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw"
)

// A supersede rule in a table whose other rules coalesce or deliver (one worker's
// ON_CONFLICT, e.g. triage.requested=drop,rebase.requested=coalesce,*=supersede): the
// event runs. (Found by the integration suite's mixed-policy scenario: the take-over
// acquire was refused for the drain the coalesce rule turns on, and the event was
// redelivered forever.)
func TestSupersedeBesideCoalesceRuns(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	l := locker(t, rdb, ns)
	stream := ns + "s"
	id := pendingEntry(t, rdb, stream, "c")
	src := &streamSource{entry: lockmw.Entry{Stream: stream, Group: "g", Consumer: "c", ID: id, ReadAt: time.Now()}}
	mw, err := handlerOf(lockmw.Config{IssueKey: taskKey, Locker: l, Agent: "rebase", Source: src, MaxIdleTime: time.Hour,
		Policies: lockmw.Policies{Default: lockmw.Rule{Policy: lockmw.Supersede},
			ByType: map[string]lockmw.Rule{"other.requested": {Policy: lockmw.Coalesce}}}})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	if _, err := h(message.NewMessage("u1", []byte(`{"metadata":{"issue":"RHEL-1"}}`))); err != nil {
		t.Fatalf("supersede beside coalesce: %v", err)
	}
	if !ran {
		t.Fatal("the event did not run")
	}
	if p := rdb.XPending(context.Background(), stream, "g").Val(); p.Count != 0 {
		t.Errorf("not acked: %+v", p)
	}
}
