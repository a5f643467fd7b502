package agentctl_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
)

// A resume whose client is closed between the publish and the forget (the process
// dies there) loses nothing: the request stays parked, and the next resume finishes
// it without a second entry. A request parked again meanwhile (a newer run) is not
// forgotten by the resume of the older one.
func TestResumeParkedCrashBetweenPublishAndForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{}, time.Minute)
	const issue = "RHEL-393"
	stream := w.ns + "resumed"
	if err := w.ledger.Park(ctx, issue, agentctl.Parked{Agent: "rebase", Stream: stream, EventType: "e", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	publish := func(ctx context.Context, p agentctl.Parked) (string, error) {
		return xonce.Run(ctx, w.rdb, xonce.Append{Stream: p.Stream, ID: p.OnceID(), TTL: agentctl.ParkedOnceTTL,
			Values: map[string]any{"parked": p.ID}})
	}

	// The dying process: its own client, closed right after the publish.
	opts, _ := redis.ParseURL(redistest.URL())
	dying := redis.NewClient(opts)
	dl, err := agentctl.NewLedger(dying, w.ns, agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = dl.ResumeParked(ctx, issue, func(ctx context.Context, p agentctl.Parked) (string, error) {
		id, err := publish(ctx, p)
		_ = dying.Close()
		return id, err
	})
	if !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("resume with its client closed after the publish: %v, want redis.ErrClosed", err)
	}
	if n := w.rdb.XLen(ctx, stream).Val(); n != 1 {
		t.Fatalf("%d entries after the first publish, want 1", n)
	}
	if parked, _ := w.ledger.ParkedRequests(ctx, issue); len(parked) != 1 {
		t.Fatalf("parked %+v after the crash, want the request kept", parked)
	}

	// The next resume (a redelivered approval): the same entry, then forgotten.
	done, err := w.ledger.ResumeParked(ctx, issue, publish)
	if err != nil || len(done) != 1 {
		t.Fatalf("second resume: %+v, %v", done, err)
	}
	first, _ := w.rdb.XRange(ctx, stream, "-", "+").Result()
	if len(first) != 1 || done[0].EntryID != first[0].ID {
		t.Fatalf("entries %v, resumed %s: want the first entry, once", first, done[0].EntryID)
	}
	if parked, _ := w.ledger.ParkedRequests(ctx, issue); len(parked) != 0 {
		t.Fatalf("parked %+v after the resume, want none", parked)
	}

	// Parked again while a resume publishes the older request: the newer one stays.
	if err := w.ledger.Park(ctx, issue, agentctl.Parked{Agent: "rebase", Stream: stream, EventType: "e", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	_, err = w.ledger.ResumeParked(ctx, issue, func(ctx context.Context, p agentctl.Parked) (string, error) {
		id, err := publish(ctx, p)
		if err == nil {
			err = w.ledger.Park(ctx, issue, agentctl.Parked{Agent: "rebase", Stream: stream, EventType: "e2", Payload: []byte(`{}`)})
		}
		return id, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if parked, _ := w.ledger.ParkedRequests(ctx, issue); len(parked) != 1 || parked[0].EventType != "e2" {
		t.Fatalf("parked %+v, want the request parked during the resume", parked)
	}
}

// A parked request that is not a valid request is dropped, not kept forever.
func TestResumeParkedDropsInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{}, time.Minute)
	const issue = "RHEL-394"
	if err := w.rdb.HSet(ctx, w.ns+"ctl:{"+issue+"}:parked", "triage", "not json").Err(); err != nil {
		t.Fatal(err)
	}
	done, err := w.ledger.ResumeParked(ctx, issue, func(context.Context, agentctl.Parked) (string, error) {
		t.Error("an invalid request was published")
		return "", nil
	})
	if err != nil || len(done) != 1 || !errors.Is(done[0].Dropped, agentctl.ErrParkedInvalid) {
		t.Fatalf("%+v, %v: want it dropped", done, err)
	}
	if n := w.rdb.Exists(ctx, w.ns+"ctl:{"+issue+"}:parked").Val(); n != 0 {
		t.Fatal("the invalid request is still parked")
	}
}
