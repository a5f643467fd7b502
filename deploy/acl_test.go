package deploy

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/internal/delayq"
	"github.com/ymirflow/ymirflow/internal/drainreq"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// The users of base/secrets.yaml, applied to a real Redis, can do what their
// commands need and nothing else: the workers' user runs a router (read, lease,
// fenced publish, results, dead letters, claims), the operators' user runs every
// inspection and repair; neither can touch other keys or the server.
func TestACLUsersOnRealRedis(t *testing.T) {
	t.Parallel()
	srv, sec := aclServer(t)
	admin := srv.Client()
	ctx := context.Background()
	client := func(key string) redis.UniversalClient { return aclClient(t, srv, sec, key) }
	worker, operator := client("redis-url"), client("operator-url")
	workerOpts, _ := pipeline.ClientOptions(strings.Replace(secretValue(sec, "redis-url"), "valkey:6379", srv.Addr(), 1))
	topo := event.Topology{} // the deployed namespace, ymir

	aclConsumerClaim(t, ctx, admin, worker, topo)
	wlocker := aclWorkerRouter(t, ctx, admin, worker, operator, workerOpts, topo)

	// Every operator command.
	olocker, err := lease.New(operator, lease.Options{Scope: topo.LockScope(), TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inspect.New(inspect.Config{Client: operator, Topology: topo, Locker: olocker, MaxLen: 1000})
	if err != nil {
		t.Fatal(err)
	}
	le, err := wlocker.Acquire(ctx, "rebase", "RHEL-9", lease.AcquireOptions{})
	if err != nil {
		t.Fatalf("worker acquire: %v", err)
	}
	defer le.Release(ctx)
	_, err = in.Pending(ctx, inspect.PendingFilter{})
	nopermFatal(t, "pending", err)
	locks, err := in.Locks(ctx, inspect.LockFilter{})
	nopermFatal(t, "locks", err)
	if len(locks) != 1 {
		t.Errorf("operator sees %d leases, want 1", len(locks))
	}
	// The workers' user: concurrency limits (RUN_LIMITS): a slot taken, an event that
	// waits for one (its copy appended when the slot is handed on), the waker's sweep; the
	// operators' user reads them (locks).
	checkSlotsACL(ctx, t, wlocker, olocker, topo.Stream("rebase", "c9s", false),
		func(what string, err error) { nopermFatal(t, what, err) })
	aclWorkerPolicies(t, ctx, worker, wlocker, topo)
	_, err = in.Streams(ctx)
	nopermFatal(t, "streams", err)
	aclOperatorWrites(t, ctx, in, wlocker, topo)
	operatorApproves(t, worker, operator, topo)
	auditACL(t, worker, operator, topo)
	aclNothingElse(t, ctx, worker, operator, topo)
}

// nopermFatal fails the test when err is the server's NOPERM for what.
func nopermFatal(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("%s: %v", what, err)
	}
}

// aclConsumerClaim: the workers' user claims its consumer name and frees it.
func aclConsumerClaim(t *testing.T, ctx context.Context, admin, worker redis.UniversalClient, topo event.Topology) {
	t.Helper()
	// The workers' user claims its consumer name (one process per name) and frees it.
	claim, err := pipeline.ClaimConsumer(ctx, worker, topo, "triage", "w1", time.Second, zerolog.Nop())
	if err != nil {
		t.Fatalf("worker user: claim the consumer name: %v", err)
	}
	claim.Release(ctx)
	if n := admin.Exists(ctx, topo.ConsumerClaimKey("triage", "w1")).Val(); n != 0 {
		t.Fatalf("worker user: the consumer name claim is left after Release")
	}
}

// aclWorkerRouter runs a triage router on the workers' user over two events the
// operators' user enqueues: it publishes downstream under its lease, records a result
// and dead-letters the bad one. It returns the router's locker.
func aclWorkerRouter(t *testing.T, ctx context.Context, admin, worker, operator redis.UniversalClient, workerOpts *redis.UniversalOptions, topo event.Topology) *lease.Locker {
	t.Helper()
	// The workers' user: a triage router that publishes downstream under its lease,
	// records results, and dead-letters a bad event.
	wlocker, err := lease.New(worker, lease.Options{Scope: topo.LockScope(), TTL: 3 * time.Second, Owner: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	pub := event.NewPublisher(worker, 1000)
	results := event.NewResults(worker, topo.Results(), 1000)
	runs := make(chan string, 10)
	r, err := pipeline.NewRouter(pipeline.RouterConfig{Client: worker, ClientOptions: workerOpts, Topology: topo,
		Agent: "triage", Consumer: "w1", BlockTime: 200 * time.Millisecond, MaxIdleTime: 2 * time.Second,
		ClaimInterval: 100 * time.Millisecond, MaxRetries: 1, MaxLen: 1000, Locker: wlocker,
		Handler: func(msg *message.Message) error {
			key := msg.Metadata.Get(event.MetaIssueKey)
			defer func() { runs <- key }()
			if key == "RHEL-2" {
				return event.ErrBadEvent
			}
			out, err := event.New(event.RebaseRequested, key, event.Task{}, msg)
			if err != nil {
				return err
			}
			if _, err := pub.PublishID(msg.Context(), topo.Stream("rebase", "c9s", false), out); err != nil {
				return err
			}
			rec := event.RecordFor(msg, "triage", event.StageDone)
			_, err = results.Add(msg.Context(), rec)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()

	// The operators' user: enqueue by hand.
	opub := event.NewPublisher(operator, 1000)
	for _, key := range []string{"RHEL-1", "RHEL-2"} {
		task, _ := event.ParseTask([]byte(`{"metadata":{"issue":"` + key + `"}}`))
		msg, _ := event.New(event.TriageRequested, key, task, nil)
		if _, err := opub.PublishID(ctx, topo.Stream("triage", "", false), msg); err != nil {
			t.Fatalf("operator enqueue: %v", err)
		}
	}
	for range 2 {
		select {
		case <-runs:
		case err := <-done:
			t.Fatalf("router stopped: %v", err)
		case <-time.After(15 * time.Second):
			t.Fatal("the worker user's router did not run both events")
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		n, _ := admin.XLen(ctx, topo.Dead()).Result()
		m, _ := admin.XLen(ctx, topo.Results()).Result()
		return n == 1 && m >= 1
	}, "a dead letter and a result written by the worker user")
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("router: %v", err)
	}
	return wlocker
}

// aclWorkerPolicies: the workers' user holds a lease with a shared scope, supersedes a
// run (the stop hash, its announcement on the eviction channel), and delays and
// promotes an event.
func aclWorkerPolicies(t *testing.T, ctx context.Context, worker redis.UniversalClient, wlocker *lease.Locker, topo event.Topology) {
	t.Helper()
	// The workers' user: a lease with a shared scope, and a delayed event (policy
	// delay) kept and promoted.
	sl, err := wlocker.Acquire(ctx, "backport", "RHEL-8", lease.AcquireOptions{
		Shared: []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-8"}}})
	if err != nil {
		t.Fatalf("worker acquire with scope issue: %v", err)
	}
	if _, err := sl.Release(ctx); err != nil {
		t.Fatalf("worker release with scope issue: %v", err)
	}
	// The workers' user: a supersede take-over (the stop hash, its announcement) and
	// the superseded run's stop, heard on the eviction channel.
	evictions := worker.Subscribe(ctx, wlocker.EvictionChannel())
	defer evictions.Close()
	if _, err := evictions.Receive(ctx); err != nil {
		t.Fatalf("worker subscribes to %s: %v", wlocker.EvictionChannel(), err)
	}
	old, err := wlocker.Acquire(ctx, "rebase", "RHEL-6", lease.AcquireOptions{MessageID: "1-0", Supersede: true})
	if err != nil {
		t.Fatalf("worker supersede acquire: %v", err)
	}
	newer, err := wlocker.Acquire(ctx, "rebase", "RHEL-6", lease.AcquireOptions{MessageID: "2-0", Supersede: true})
	if err != nil || newer.Supersedes() != "1-0" {
		t.Fatalf("worker supersede take-over: %v", err)
	}
	if m, err := evictions.ReceiveMessage(ctx); err != nil || !strings.HasSuffix(m.Payload, " 2-0") {
		t.Fatalf("the take-over's announcement: %v, %v", m, err)
	}
	_, _ = old.Release(ctx)
	if err := newer.WaitStopped(); err != nil {
		t.Fatalf("worker waits for the superseded run: %v", err)
	}
	_, _ = newer.Release(ctx)
	triage := topo.Stream("triage", "", false)
	member, _ := delayq.Member("1-1", map[string]any{"payload": `{"metadata":{"issue":"RHEL-7"}}`, "m:issue_key": "RHEL-7"})
	if err := worker.ZAdd(ctx, delayq.Key(triage), redis.Z{Score: 1, Member: member}).Err(); err != nil {
		t.Fatalf("worker delays an event: %v", err)
	}
	if n, _, err := delayq.Promote(ctx, worker, triage); err != nil || n != 1 {
		t.Fatalf("worker promotes a delayed event: moved %d, %v", n, err)
	}
}

// aclOperatorWrites: every operator write, audited (as an operator, with a reason), and
// the reads of the trail.
func aclOperatorWrites(t *testing.T, ctx context.Context, in *inspect.Inspector, wlocker *lease.Locker, topo event.Topology) {
	t.Helper()
	triage := topo.Stream("triage", "", false)
	// The operators' writes are audited: they run as an operator, with a reason.
	ctx = audit.WithOperator(ctx, audit.Operator{Who: "alice@laptop", From: "cli laptop", Reason: "acl test"})
	_, err := in.History(ctx, "RHEL-1")
	nopermFatal(t, "history", err)
	_, err = in.Replay(ctx, inspect.ReplayOptions{Stream: "triage", Issue: "RHEL-1"})
	nopermFatal(t, "replay", err)
	dls, err := in.DeadLetters(ctx, inspect.DeadFilter{})
	nopermFatal(t, "dlq list", err)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters", len(dls))
	}
	_, err = in.Requeue(ctx, dls[0].ID)
	nopermFatal(t, "dlq requeue", err)
	_, err = in.ForceRelease(ctx, "rebase", "RHEL-9")
	nopermFatal(t, "locks release", err)
	// Pause (operator), park (worker), list and resume (operator).
	_, err = in.Pause(ctx, "issue:RHEL-5", false)
	nopermFatal(t, "pause", err)
	ple, err := wlocker.Acquire(ctx, "triage", "RHEL-5", lease.AcquireOptions{})
	if err != nil {
		t.Fatalf("worker acquire: %v", err)
	}
	res, err := wlocker.Pauses().Check(ctx, lease.PauseTarget{Agent: "triage", Issue: "RHEL-5"}, lease.ParkEntry{Stream: triage, Group: "triage",
		ID: "1-5", LineID: "1-5", Issue: "RHEL-5", Ack: true, Fields: func() (map[string]any, error) { return map[string]any{"payload": "{}"}, nil }})
	if err != nil || res.Verdict != lease.ParkedNow {
		t.Fatalf("worker parks an event of a paused issue: %+v %v", res, err)
	}
	if err := ple.Park(ctx); err != nil {
		t.Fatalf("worker gives a parked event's lease back: %v", err)
	}
	ps, err := in.Pauses(ctx)
	nopermFatal(t, "pause --list", err)
	if len(ps) != 1 || ps[0].Waiting != 1 {
		t.Errorf("pauses: %+v", ps)
	}
	if r, err := in.Resume(ctx, "issue:RHEL-5"); err != nil || r.Published != 1 {
		t.Fatalf("operator resume: %+v %v", r, err)
	}
	_, err = in.Purge(ctx, inspect.TimeID(time.Now()))
	nopermFatal(t, "dlq purge", err)
	nopermFatal(t, "drain", in.Drain(ctx, drainreq.Target{Agent: "rebase"}))
	_, err = in.Drains(ctx)
	nopermFatal(t, "drain list", err)
	nopermFatal(t, "drain --undo", in.Undrain(ctx, drainreq.Target{Agent: "rebase"}))
	recs, err := in.Audit(ctx, audit.Filter{})
	if err != nil || len(recs) != 8 {
		t.Fatalf("operator user: the audit trail has %d writes (%v), want replay, requeue, release, purge, drain, undrain, pause and resume", len(recs), err)
	}
	if rep, err := in.Timeline(ctx, "RHEL-9"); err != nil || rep.Events[len(rep.Events)-1].Kind != inspect.KindAudit {
		t.Fatalf("operator user: history with the audit trail: %v", err)
	}
	_, err = in.Cost(ctx, "RHEL-9") // the console's issue page: the agents' ledger
	nopermFatal(t, "cost", err)
}

// aclNothingElse: neither user can touch other keys or the server, and the operators'
// user does not consume.
func aclNothingElse(t *testing.T, ctx context.Context, worker, operator redis.UniversalClient, topo event.Topology) {
	t.Helper()
	// Nothing else.
	for name, c := range map[string]redis.UniversalClient{"worker": worker, "operator": operator} {
		for _, cmd := range [][]any{{"FLUSHALL"}, {"CONFIG", "GET", "*"}, {"KEYS", "*"}, {"SET", "other:key", "x"},
			{"GET", "other:key"}, {"ACL", "LIST"}, {"SHUTDOWN"}, {"SCRIPT", "FLUSH"}, {"CLIENT", "KILL", "TYPE", "normal"}, {"MODULE", "LIST"}} {
			if err := c.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("%s user: %v: %v, want NOPERM", name, cmd, err)
			}
		}
	}
	if err := operator.Do(ctx, "XREADGROUP", "GROUP", "triage", "x", "STREAMS", topo.Stream("triage", "", false), ">").Err(); err == nil ||
		!strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("operator user consumes: %v", err)
	}
}

// aclServer starts a redis-server of the test's own with the users of base/secrets.yaml
// (users.acl) set on it, the default user kept for the harness, and returns it with the
// Secret.
func aclServer(t *testing.T) (*redistest.Server, *corev1.Secret) {
	t.Helper()
	sec := get(t, "base").secrets["ymirflow-redis"]
	if sec == nil {
		t.Fatal("base has no Secret ymirflow-redis")
	}
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	admin := srv.Client()
	for _, line := range strings.Split(secretValue(sec, "users.acl"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] == "default" { // the harness keeps the default user
			continue
		}
		args := []any{"ACL", "SETUSER"}
		for _, x := range f[1:] {
			args = append(args, x)
		}
		if err := admin.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s: %v", f[1], err)
		}
	}
	return srv, sec
}

// aclClient connects to srv as the user of the Secret's URL key (redis-url,
// operator-url), closed when the test ends.
func aclClient(t *testing.T, srv *redistest.Server, sec *corev1.Secret, key string) redis.UniversalClient {
	t.Helper()
	u, err := url.Parse(secretValue(sec, key))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = srv.Addr()
	c, err := pipeline.Connect(context.Background(), u.String())
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// auditACL: the workers' user cannot read, append to or delete the audit trail, so an
// Inspector on its client writes nothing (audit.ErrNotRecorded: the fault of a user
// that cannot XADD to the trail); the operators' user appends to it but cannot delete,
// trim, overwrite or expire it.
func auditACL(t *testing.T, worker, operator redis.UniversalClient, topo event.Topology) {
	t.Helper()
	ctx := context.Background()
	trail := topo.Audit()
	wlocker, err := lease.New(worker, lease.Options{Scope: topo.LockScope(), TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	win, err := inspect.New(inspect.Config{Client: worker, Topology: topo, Locker: wlocker})
	if err != nil {
		t.Fatal(err)
	}
	le, err := wlocker.Acquire(ctx, "rebase", "RHEL-5", lease.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	opctx := audit.WithOperator(ctx, audit.Operator{Who: "mallory", From: "a worker pod", Reason: "hide my tracks"})
	if _, err := win.ForceRelease(opctx, "rebase", "RHEL-5"); !errors.Is(err, audit.ErrNotRecorded) || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("a write on the workers' user: %v, want audit.ErrNotRecorded (NOPERM)", err)
	}
	if _, err := win.Lease(ctx, "rebase", "RHEL-5"); err != nil {
		t.Errorf("the unrecorded release happened: %v", err)
	}
	for _, cmd := range [][]any{{"XADD", trail, "*", "who", "mallory"}, {"XRANGE", trail, "-", "+"}, {"DEL", trail},
		{"ZADD", "{" + trail + "}:issue:RHEL-5", "1", "x"}} {
		if err := worker.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("workers' user: %v: %v, want NOPERM", cmd, err)
		}
	}
	for _, cmd := range [][]any{{"DEL", trail}, {"XTRIM", trail, "MAXLEN", "0"}, {"XDEL", trail, "1-0"}, {"SET", trail, "x"},
		{"PEXPIRE", trail, "1"}, {"EVAL", "return redis.call('DEL', KEYS[1])", "1", trail},
		{"EVAL", "return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)", "1", trail}} {
		if err := operator.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't access") {
			t.Errorf("operators' user: %v: %v, want NOPERM", cmd, err)
		}
	}
	if n := operator.XLen(ctx, trail).Val(); n < 4 {
		t.Errorf("the trail holds %d records after the attempts to delete it", n)
	}
}

// operatorApproves: a request parked by the workers' user (budget exhausted) is
// resumed by the operators' user as `ymirflow budget approve` does: the raise, the
// idempotent publish, then the forget (issue 39).
func operatorApproves(t *testing.T, worker, operator redis.UniversalClient, topo event.Topology) {
	t.Helper()
	ctx := context.Background()
	wl, err := agentctl.NewLedger(worker, event.DefaultNamespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	rebase := topo.Stream("rebase", "c9s", false)
	if err := wl.Park(ctx, "RHEL-9", agentctl.Parked{Agent: "rebase", Stream: rebase, EventType: event.RequestedEvent("rebase"),
		Payload: []byte(`{"metadata":{"jira_issue":"RHEL-9","target_branch":"c9s"}}`)}); err != nil {
		t.Fatalf("worker parks a request: %v", err)
	}
	ol, err := agentctl.NewLedger(operator, event.DefaultNamespace+":", agentctl.Budgets{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ol.Raise(ctx, "RHEL-9", 5, "acl"); err != nil {
		t.Fatalf("operator raises a budget: %v", err)
	}
	pub := event.NewPublisher(operator, 1000)
	done, err := ol.ResumeParked(ctx, "RHEL-9", func(ctx context.Context, p agentctl.Parked) (string, error) {
		task, err := event.ParseTask(p.Payload)
		if err != nil {
			return "", err
		}
		msg, err := event.New(p.EventType, "RHEL-9", task, nil)
		if err != nil {
			return "", err
		}
		return pub.PublishOnce(ctx, p.Stream, msg, p.OnceID(), agentctl.ParkedOnceTTL)
	})
	if err != nil || len(done) != 1 || done[0].EntryID == "" {
		t.Fatalf("operator resumes the parked request: %+v, %v", done, err)
	}
	if left, err := ol.ParkedRequests(ctx, "RHEL-9"); err != nil || len(left) != 0 {
		t.Fatalf("after the resume: parked %+v, %v", left, err)
	}
}

func checkSlotsACL(ctx context.Context, t *testing.T, w, o *lease.Locker, stream string, noperm func(string, error)) {
	t.Helper()
	req := func(lid string) lease.SlotRequest {
		return lease.SlotRequest{Limits: []lease.Limit{{Key: "agent:rebase", N: 1}}, LineID: lid, Issue: "RHEL-9",
			Fair: "X", Event: lease.QueuedEvent{Stream: stream, Fields: map[string]any{"slot_from": lid}}}
	}
	s, err := w.TakeSlots(ctx, req("1-1"))
	noperm("worker: take a slot", err)
	if err != nil {
		t.Fatalf("worker: take a slot: %v", err)
	}
	_, err = w.TakeSlots(ctx, req("1-2"))
	if !errors.Is(err, lease.ErrSlotsFull) {
		t.Fatalf("worker: a second take under limit 1: %v, want it to wait", err)
	}
	_, err = s.Renew(ctx)
	noperm("worker: renew a slot", err)
	_, err = o.SlotUsages(ctx)
	noperm("operator: read the slots", err)
	noperm("worker: free a slot", s.Release(ctx))
	_, err = w.WakeSlots(ctx, lease.Limit{Key: "agent:rebase", N: 1}, 0, 0)
	noperm("worker: wake the slots", err)
	_, err = w.SlotUsages(ctx)
	noperm("worker: sweep the slots", err)
}
