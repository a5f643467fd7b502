package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline/pipelinetest"
)

// lua returns the concatenated source of Lua files, as the packages that embed them
// put them together (lockmw/lease: lease.lua before the scripts that use its steps).
func lua(t *testing.T, paths ...string) string {
	t.Helper()
	var src string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		src += string(b)
	}
	return src
}

// The lost-reply matrix (issue 22): for every kind of command an event's path sends,
// the command runs on Redis and its reply is lost once (the connection is cut), so
// go-redis sends it again. After each: every entry of the input stream has exactly one
// terminal record (stage.done, lock.dropped, lock.coalesced, lock.delivered,
// lock.superseded, or a dead letter), none
// is pending, no record is doubled, and the issue is not stuck: a new event for it
// runs within seconds, far less than the lease TTL.
func TestLostReplyMatrix(t *testing.T) {
	// Not parallel: it drops replies in a proxy and times the lease's heartbeat against its TTL; it is already sensitive to load.
	const dir = "../lockmw/lease/scripts/"
	// As the lease puts them together: xonce's index step before its steps.
	lease := xonce.IndexLua + lua(t, dir+"lease.lua")
	once := lua(t, "../internal/xonce/xadd_once.lua")
	scripts := map[string]string{
		"acquire":              lease + lua(t, dir+"acquire.lua"),
		"handoff":              lease + lua(t, dir+"handoff.lua"),
		"handoff_batch":        lease + lua(t, dir+"handoff_batch.lua"),
		"release":              lease + lua(t, dir+"release.lua"),
		"extend":               lua(t, dir+"extend.lua"),
		"acquire_or_queue":     lease + lua(t, dir+"acquire_or_queue.lua"),
		"acquire_or_deliver":   lease + lua(t, dir+"acquire_or_deliver.lua"),
		"acquire_or_supersede": lease + lua(t, dir+"acquire_or_supersede.lua"),
		"stop_wait":            lease + lua(t, dir+"stop_wait.lua"),
		"xadd_once":            once,
	}
	// Whatever carries the dead letter: a script, or the EXEC of a transaction.
	deadLetter := redistest.Any(redistest.Script(once, event.DeadFieldError), redistest.Command("exec"))
	cases := []struct {
		name     string
		match    redistest.Match
		scenario string
	}{
		{"acquire", redistest.Script(scripts["acquire"]), "one"},
		// Policy drop ends its runs in batches (handoff_batch.lua); coalesce, which drains,
		// one by one (handoff.lua).
		{"release and ack (handoff)", redistest.Script(scripts["handoff_batch"]), "one"},
		{"handoff acquire of the next entry", redistest.Script(scripts["handoff_batch"], "RHEL-2"), "two issues"},
		{"extend", redistest.Script(scripts["extend"]), "long"},
		{"release after exhausted retries", redistest.Script(scripts["release"]), "fail"},
		{"fenced xadd of the outcome", redistest.Arg(event.StageDone), "one"},
		{"dead letter", deadLetter, "bad"},
		{"dead letter after exhausted retries", deadLetter, "fail"},
		{"conflict record", redistest.Arg(event.LockDropped), "conflict"},
		{"xack of a dropped event", redistest.Command("xack"), "conflict"},
		{"acquire or queue", redistest.Script(scripts["acquire_or_queue"]), "coalesce"},
		{"release and drain (handoff)", redistest.Script(scripts["handoff"]), "coalesce"},
		{"coalesced conflict record", redistest.Arg(event.LockCoalesced), "coalesce"},
		{"acquire or deliver", redistest.Script(scripts["acquire_or_deliver"]), "deliver"},
		{"delivered conflict record", redistest.Arg(event.LockDelivered), "deliver"},
		{"acquire or supersede", redistest.Script(scripts["acquire_or_supersede"]), "supersede"},
		{"wait for the superseded run to stop", redistest.Script(scripts["stop_wait"]), "supersede"},
		{"superseded record", redistest.Arg(event.LockSuperseded), "supersede"},
	}
	direct, _ := redistest.Client(t)
	for _, src := range scripts {
		// Loaded up front, so no EVALSHA meets NOSCRIPT: the lost reply must be that of
		// a command that ran.
		if err := direct.ScriptLoad(context.Background(), src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	addr := direct.Options().Addr
	db := direct.Options().DB
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			proxy := redistest.NewLossyProxy(t, addr)
			e := envOf(t, pipelinetest.OnURL(t, proxy.URL(db)))
			lostReply(t, e, direct, proxy, c.match, c.scenario)
		})
	}
}

func lostReply(t *testing.T, e *env, direct *redis.Client, proxy *redistest.LossyProxy, match redistest.Match, scenario string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lr := &lostReplyRun{t: t, ctx: ctx, e: e, direct: direct, scenario: scenario,
		results: event.NewResults(e.rdb, e.topo.Results(), 0)}
	e.start(ctx, lr.options(), lr.handle)
	proxy.LoseReply(match, 1)
	lr.publish()
	// Settled: every entry of the stream has its terminal record and none is pending.
	redistest.Eventually(t, 10*time.Second, lr.settled, "every event has its terminal record")
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy lost %d replies, want 1: the command under test was not on the path", proxy.Cuts())
	}
	per, n := lr.terminal()
	for _, m := range direct.XRange(ctx, e.triage(), "-", "+").Val() {
		if per[m.ID] != 1 {
			t.Errorf("entry %s has %d terminal records, want exactly 1 (all: %v)", m.ID, per[m.ID], per)
		}
	}
	if len(per) != n {
		t.Errorf("%d records name %d entries: %v", len(per), n, per)
	}
	// Not stuck: a new event for the issue runs at once (seconds, not the 30 s TTL).
	lr.failing.Store(false)
	lr.blockFirst.Store(false)
	before := lr.records(event.StageDone)
	e.publishTriage("RHEL-1")
	redistest.Eventually(t, 5*time.Second, func() bool { return lr.records(event.StageDone) == before+1 },
		"a new event for the issue ran after the lost reply (the issue is stuck)")
}

// lostReplyRun is one scenario of TestLostReply: its router's handler and what it reads
// back through direct (a client that does not cross the proxy).
type lostReplyRun struct {
	t                   *testing.T
	ctx                 context.Context
	e                   *env
	direct              *redis.Client
	scenario            string
	results             *event.Results
	failing, blockFirst atomic.Bool
	runs                pipelinetest.Runs
}

// records counts the results records of eventType.
func (lr *lostReplyRun) records(eventType string) int {
	n := 0
	for _, m := range lr.direct.XRange(lr.ctx, lr.e.topo.Results(), "-", "+").Val() {
		if m.Values["event_type"] == eventType {
			n++
		}
	}
	return n
}

// options are the router's options for the scenario (and its handler's first behaviour).
func (lr *lostReplyRun) options() routerOpts {
	o := routerOpts{TTL: 30 * time.Second, MaxIdle: 20 * time.Second}
	switch lr.scenario {
	case "long":
		o.TTL, o.MaxIdle = 3*time.Second, 2*time.Second
	case "fail":
		lr.failing.Store(true)
	case "conflict", "coalesce", "deliver", "supersede":
		lr.blockFirst.Store(true)
		o.Concurrency = 2
		switch lr.scenario {
		case "coalesce":
			o.Policy = lockmw.Coalesce
		case "deliver":
			o.Policy = lockmw.Deliver
		case "supersede":
			// The take-over's announcement may not cross the proxy: the old holder's
			// heartbeat (TTL/3) finds it then.
			o.Policy, o.TTL, o.MaxIdle = lockmw.Supersede, 3*time.Second, 2*time.Second
		}
	}
	return o
}

// handle is the router's handler: it runs the scenario's first event long, blocked or
// failing, then records the event done.
func (lr *lostReplyRun) handle(msg *message.Message) error {
	n := lr.runs.Add(issueOf(msg))
	switch {
	case lr.scenario == "long" && n == 1:
		// Past the first heartbeat (TTL/3): the extend is on this run's path.
		select {
		case <-time.After(1500 * time.Millisecond):
		case <-msg.Context().Done():
			return msg.Context().Err()
		}
	case lr.scenario == "supersede" && lr.blockFirst.Load() && n == 1:
		// Run until a newer event takes the issue over.
		select {
		case <-msg.Context().Done():
			return msg.Context().Err()
		case <-time.After(5 * time.Second):
		}
	case lr.blockFirst.Load() && n == 1:
		lr.holdUntilMet()
	case lr.failing.Load():
		return errBoom
	}
	_, err := lr.results.Add(msg.Context(), event.Record{EventType: event.StageDone, Agent: "triage",
		IssueKey: issueOf(msg), MessageID: event.EntryID(msg), Stream: event.EntryStream(msg)})
	return err
}

// holdUntilMet holds the issue until the second event met the held lease (its busy
// policy's record), at most 5 s.
func (lr *lostReplyRun) holdUntilMet() {
	want := event.LockDropped
	switch lr.scenario {
	case "coalesce":
		want = event.LockCoalesced
	case "deliver":
		want = event.LockDelivered
	}
	deadline := time.Now().Add(5 * time.Second)
	for lr.records(want) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// publish appends the scenario's events.
func (lr *lostReplyRun) publish() {
	t, e := lr.t, lr.e
	switch lr.scenario {
	case "bad":
		if err := lr.direct.XAdd(lr.ctx, &redis.XAddArgs{Stream: e.triage(), Values: map[string]any{
			"_watermill_message_uuid": "u-bad", "m:schema_version": "9", "m:issue_key": "RHEL-1",
			"payload": `{"metadata":{"issue":"RHEL-1"}}`}}).Err(); err != nil {
			t.Fatal(err)
		}
	case "two issues":
		e.publishTriage("RHEL-1")
		e.publishTriage("RHEL-2")
	case "conflict", "coalesce", "deliver", "supersede":
		lr.publishConflict()
	default:
		e.publishTriage("RHEL-1")
	}
}

// publishConflict publishes a first event for RHEL-1 and, once it runs, more until one
// is read by the other consumer (so that it meets the held lease).
func (lr *lostReplyRun) publishConflict() {
	t, e, direct := lr.t, lr.e, lr.direct
	first := e.publishTriage("RHEL-1")
	redistest.Eventually(t, 10*time.Second, func() bool { return lr.runs.Get("RHEL-1") == 1 }, "first run started")
	holder := consumerOf(t, direct, e.triage(), first)
	// The event under test must meet the held lease, so at the other consumer: one
	// that lands in the holder's own read-ahead waits for the run to end, and then
	// runs (coalesce) or is superseded (drop), meeting no lease. Publish again until
	// one lands elsewhere; each extra event still gets its one terminal record.
	for range 5 {
		id := e.publishTriage("RHEL-1")
		var at string
		redistest.Eventually(t, 10*time.Second, func() bool {
			at = consumerOf(t, direct, e.triage(), id)
			return at != "" || lr.records(event.LockDropped)+lr.records(event.LockCoalesced)+lr.records(event.LockDelivered)+lr.records(event.LockSuperseded) > 0
		}, "event %s read", id)
		if at != holder {
			break
		}
	}
}

// terminal counts the terminal records (results and dead letters) per entry id, and
// returns them with the number of entries of the stream.
func (lr *lostReplyRun) terminal() (map[string]int, int) {
	ctx, e, direct := lr.ctx, lr.e, lr.direct
	per := map[string]int{}
	for _, m := range direct.XRange(ctx, e.topo.Results(), "-", "+").Val() {
		switch m.Values["event_type"] {
		case event.StageDone, event.LockDropped, event.LockCoalesced, event.LockDelivered, event.LockSuperseded:
			per[fmt.Sprint(m.Values["message_id"])]++
		}
	}
	for _, m := range direct.XRange(ctx, e.topo.Dead(), "-", "+").Val() {
		per[fmt.Sprint(m.Values[event.DeadFieldID])]++
	}
	return per, len(direct.XRange(ctx, e.triage(), "-", "+").Val())
}

// settled reports whether every entry has a terminal record and none is pending.
func (lr *lostReplyRun) settled() bool {
	per, n := lr.terminal()
	if len(per) < n || lr.e.pending(lr.e.triage()) != 0 {
		return false
	}
	for _, c := range per {
		if c == 0 {
			return false
		}
	}
	return true
}

// consumerOf is the consumer that entry id of stream is pending for, "" if none.
func consumerOf(t *testing.T, rdb redis.UniversalClient, stream, id string) string {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "triage",
		Start: id, End: id, Count: 1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) == 0 {
		return ""
	}
	return p[0].Consumer
}
