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

// BeginAsk: one run asks at a level; another finds it busy while the asker holds its
// lease and its deadline is ahead, and takes it over when either ends; the asker itself
// may ask again (a retry of its failed post); an asked level is not asked again; a
// raise opens the next level.
func TestBeginAsk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	const issue = "RHEL-395"
	a, ra := w.acquire(t, "triage", issue)
	_, rb := w.acquire(t, "rebase", issue)
	want := func(run agentctl.Run, deadline time.Duration, status string, level int64) agentctl.Ask {
		t.Helper()
		ask, err := w.ledger.BeginAsk(ctx, issue, run, deadline)
		if err != nil || ask.Status != status || ask.Level != level {
			t.Fatalf("ask of %s: %+v, %v; want %s at %d", run.Agent, ask, err, status, level)
		}
		return ask
	}
	want(ra, time.Hour, agentctl.AskPost, 0)
	want(rb, time.Hour, agentctl.AskBusy, 0)
	want(ra, time.Hour, agentctl.AskPost, 0) // the asker's retry
	want(ra, time.Millisecond, agentctl.AskPost, 0)
	time.Sleep(5 * time.Millisecond)                // the deadline passes (not a synchronisation)
	ask := want(rb, time.Hour, agentctl.AskPost, 0) // a late asker is taken over
	if _, err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, ra = w.acquire(t, "triage", issue)
	want(ra, time.Hour, agentctl.AskBusy, 0)
	if err := w.ledger.Asked(ctx, issue, ask); err != nil {
		t.Fatal(err)
	}
	want(ra, time.Hour, agentctl.AskAsked, 0)
	if _, err := w.ledger.Raise(ctx, issue, 1, "approval"); err != nil {
		t.Fatal(err)
	}
	want(ra, time.Hour, agentctl.AskPost, 1_000_000)
	if m := ask.Marker(issue); m != "{{ymir-budget-ask RHEL-395 0}}" {
		t.Fatalf("marker %q", m)
	}
}

// An ask whose asker died (its lease gone) is taken over at once.
func TestBeginAskDeadAskerTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, agentctl.Budgets{Issue: 1}, time.Minute)
	const issue = "RHEL-396"
	_, ra := w.acquire(t, "triage", issue)
	_, rb := w.acquire(t, "rebase", issue)
	if ask, err := w.ledger.BeginAsk(ctx, issue, ra, time.Hour); err != nil || ask.Status != agentctl.AskPost {
		t.Fatal(ask, err)
	}
	if err := w.rdb.Del(ctx, ra.LockKey, ra.InfoKey).Err(); err != nil { // its lease expired
		t.Fatal(err)
	}
	if ask, err := w.ledger.BeginAsk(ctx, issue, rb, time.Hour); err != nil || ask.Status != agentctl.AskPost {
		t.Fatalf("after the asker died: %+v, %v; want post", ask, err)
	}
}
