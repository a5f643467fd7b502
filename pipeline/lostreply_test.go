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
		{"release and ack (handoff)", redistest.Script(scripts["handoff"]), "one"},
		{"handoff acquire of the next entry", redistest.Script(scripts["handoff"], "RHEL-2"), "two issues"},
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
	results := event.NewResults(e.rdb, e.topo.Results(), 0)
	var failing, blockFirst atomic.Bool
	var runs pipelinetest.Runs
	records := func(eventType string) int {
		n := 0
		for _, m := range direct.XRange(ctx, e.topo.Results(), "-", "+").Val() {
			if m.Values["event_type"] == eventType {
				n++
			}
		}
		return n
	}
	o := routerOpts{TTL: 30 * time.Second, MaxIdle: 20 * time.Second}
	switch scenario {
	case "long":
		o.TTL, o.MaxIdle = 3*time.Second, 2*time.Second
	case "fail":
		failing.Store(true)
	case "conflict", "coalesce", "deliver", "supersede":
		blockFirst.Store(true)
		o.Concurrency = 2
		switch scenario {
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
	e.start(ctx, o, func(msg *message.Message) error {
		n := runs.Add(issueOf(msg))
		switch {
		case scenario == "long" && n == 1:
			// Past the first heartbeat (TTL/3): the extend is on this run's path.
			select {
			case <-time.After(1500 * time.Millisecond):
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
		case scenario == "supersede" && blockFirst.Load() && n == 1:
			// Run until a newer event takes the issue over.
			select {
			case <-msg.Context().Done():
				return msg.Context().Err()
			case <-time.After(5 * time.Second):
			}
		case blockFirst.Load() && n == 1:
			// Hold the issue until the second event met the held lease.
			want := event.LockDropped
			switch scenario {
			case "coalesce":
				want = event.LockCoalesced
			case "deliver":
				want = event.LockDelivered
			}
			deadline := time.Now().Add(5 * time.Second)
			for records(want) == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
		case failing.Load():
			return errBoom
		}
		_, err := results.Add(msg.Context(), event.Record{EventType: event.StageDone, Agent: "triage",
			IssueKey: issueOf(msg), MessageID: event.EntryID(msg), Stream: event.EntryStream(msg)})
		return err
	})
	proxy.LoseReply(match, 1)
	switch scenario {
	case "bad":
		if err := direct.XAdd(ctx, &redis.XAddArgs{Stream: e.triage(), Values: map[string]any{
			"_watermill_message_uuid": "u-bad", "m:schema_version": "9", "m:issue_key": "RHEL-1",
			"payload": `{"metadata":{"issue":"RHEL-1"}}`}}).Err(); err != nil {
			t.Fatal(err)
		}
	case "two issues":
		e.publishTriage("RHEL-1")
		e.publishTriage("RHEL-2")
	case "conflict", "coalesce", "deliver", "supersede":
		first := e.publishTriage("RHEL-1")
		redistest.Eventually(t, 10*time.Second, func() bool { return runs.Get("RHEL-1") == 1 }, "first run started")
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
				return at != "" || records(event.LockDropped)+records(event.LockCoalesced)+records(event.LockDelivered)+records(event.LockSuperseded) > 0
			}, "event %s read", id)
			if at != holder {
				break
			}
		}
	default:
		e.publishTriage("RHEL-1")
	}
	// Settled: every entry of the stream has its terminal record and none is pending.
	terminal := func() (map[string]int, int) {
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
	settled := func() bool {
		per, n := terminal()
		if len(per) < n || e.pending(e.triage()) != 0 {
			return false
		}
		for _, c := range per {
			if c == 0 {
				return false
			}
		}
		return true
	}
	redistest.Eventually(t, 10*time.Second, settled, "every event has its terminal record")
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy lost %d replies, want 1: the command under test was not on the path", proxy.Cuts())
	}
	per, n := terminal()
	for _, m := range direct.XRange(ctx, e.triage(), "-", "+").Val() {
		if per[m.ID] != 1 {
			t.Errorf("entry %s has %d terminal records, want exactly 1 (all: %v)", m.ID, per[m.ID], per)
		}
	}
	if len(per) != n {
		t.Errorf("%d records name %d entries: %v", len(per), n, per)
	}
	// Not stuck: a new event for the issue runs at once (seconds, not the 30 s TTL).
	failing.Store(false)
	blockFirst.Store(false)
	before := records(event.StageDone)
	e.publishTriage("RHEL-1")
	redistest.Eventually(t, 5*time.Second, func() bool { return records(event.StageDone) == before+1 },
		"a new event for the issue ran after the lost reply (the issue is stuck)")
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
