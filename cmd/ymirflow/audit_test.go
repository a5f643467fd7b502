package main

import (
	"context"
	"encoding/json"
	"github.com/ymirflow/ymirflow/agentctl"
	"strings"
	"testing"

	"github.com/ymirflow/ymirflow/internal/audit"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/web"
)

// cliNotWrites are the commands that make no operator write, and why.
var cliNotWrites = map[string]string{
	"dev": "runs a local pipeline", "demo": "runs a pipeline of its own", "worker": "a pipeline process",
	"fetch": "a pipeline process", "webhook": "a pipeline process", "fakejira": "a fake Jira",
	"web":     "the console: its writes are audited by the web package (TestEveryConsoleWriteIsAudited)",
	"enqueue": "publishes new requests as the fetcher does; it changes or removes nothing",
	"pending": "reads", "streams": "reads", "history": "reads", "audit": "reads", "cost": "reads",
}

// cliWrite is one invocation of an operator write: setup makes it have an effect, and
// effect says whether it had one.
type cliWrite struct {
	args   []string
	setup  func(o *opsEnv)
	effect func(o *opsEnv) bool
}

func cliWrites() map[string][]cliWrite {
	ctx := context.Background()
	held := func(o *opsEnv) {
		if _, err := o.locker.Acquire(ctx, "triage", "RHEL-30", lease.AcquireOptions{Owner: "w", MessageID: "1-0"}); err != nil {
			o.t.Fatal(err)
		}
	}
	released := func(o *opsEnv) bool {
		return !strings.Contains(o.ok("locks", "--issue", "RHEL-30", "--json"), "RHEL-30")
	}
	buried := func(o *opsEnv) { o.rdb.Del(ctx, o.topo.Dead()); o.bury(o.stream("triage", ""), "RHEL-30", "boom") }
	gone := func(o *opsEnv) bool { return o.rdb.XLen(ctx, o.topo.Dead()).Val() == 0 }
	var before int64
	queued := func(o *opsEnv) {
		before = o.rdb.XLen(ctx, o.stream("triage", "")).Val()
		o.publish(o.stream("triage", ""), "RHEL-30")
		before++
	}
	replayed := func(o *opsEnv) bool { return o.rdb.XLen(ctx, o.stream("triage", "")).Val() > before }
	raised := func(o *opsEnv) bool {
		l, err := agentctl.NewLedger(o.rdb, o.topo.Namespace+":", agentctl.Budgets{})
		if err != nil {
			o.t.Fatal(err)
		}
		c, err := l.Costs(ctx, "RHEL-30")
		return err == nil && c.RaisedUSD > 0
	}
	drainKey := func(o *opsEnv) int64 { return o.rdb.HLen(ctx, o.topo.Drains()).Val() }
	pausedNow := func(o *opsEnv) bool { return strings.Contains(o.ok("pause", "--list"), "issue:RHEL-30") }
	pauseSet := func(o *opsEnv) {
		if _, err := o.locker.Pauses().Set(ctx, lease.Pause{Scope: "issue:RHEL-30", Reason: "setup", By: "test"}); err != nil {
			o.t.Fatal(err)
		}
	}
	unpause := func(o *opsEnv) { o.rdb.Del(ctx, o.locker.Pauses().Keys().Reg) }
	return map[string][]cliWrite{
		"drain": {
			{[]string{"drain", "--agent", "rebase", "--branch", "c9s"}, func(o *opsEnv) { o.rdb.Del(ctx, o.topo.Drains()) },
				func(o *opsEnv) bool { return drainKey(o) == 1 }},
			{[]string{"drain", "--all", "--undo"}, func(o *opsEnv) { o.rdb.Del(ctx, o.topo.Drains()); o.rdb.HSet(ctx, o.topo.Drains(), "all", "{}") },
				func(o *opsEnv) bool { return drainKey(o) == 0 }},
		},
		"pause":  {{[]string{"pause", "issue:rhel-30"}, unpause, pausedNow}},
		"resume": {{[]string{"resume", "issue:RHEL-30"}, pauseSet, func(o *opsEnv) bool { return !pausedNow(o) }}},
		"budget": {{[]string{"budget", "approve", "RHEL-30", "--usd", "1", "--once", "approval-1"}, func(*opsEnv) {}, raised}},
		"locks":  {{[]string{"locks", "release", "triage", "RHEL-30", "--yes"}, held, released}},
		"replay": {{[]string{"replay", "--stream", "triage", "--issue", "RHEL-30"}, queued, replayed}},
		"dlq": {
			{[]string{"dlq", "requeue", "@dead"}, buried, gone},
			{[]string{"dlq", "requeue", "--all", "--issue", "RHEL-30"}, buried, gone},
			{[]string{"dlq", "purge", "--yes"}, buried, gone},
		},
	}
}

// TestEveryCLIWriteIsAudited walks the CLI's commands: each is an operator write or
// says why not (cliNotWrites). Each write: without --reason it is refused naming the
// flag and does nothing; with the audit stream broken (the wrong type) it fails and
// does nothing; done, the trail has who (YMIR_OPERATOR), from (cli HOST), the scope and
// the reason, and `audit` and `history` show it.
func TestEveryCLIWriteIsAudited(t *testing.T) {
	o := newOpsEnv(t)
	t.Setenv("YMIR_OPERATOR", "carol")
	ctx := context.Background()
	writes := cliWrites()
	for _, c := range commands() {
		if _, ok := cliNotWrites[c.name]; !ok && writes[c.name] == nil {
			t.Errorf("command %s is neither an audited write (cliWrites) nor in cliNotWrites", c.name)
		}
	}
	n := 0
	for _, ws := range writes {
		for _, w := range ws {
			var dead string
			args := func(extra ...string) []string {
				var out []string
				for _, a := range w.args {
					if a == "@dead" {
						a = dead
					}
					out = append(out, a)
				}
				return append(out, extra...)
			}
			// @dead in the arguments is the newest dead letter.
			setup := func() {
				w.setup(o)
				ids, _ := o.rdb.XRevRangeN(ctx, o.topo.Dead(), "+", "-", 1).Result()
				if len(ids) > 0 {
					dead = ids[0].ID
				}
			}
			what := strings.Join(w.args, " ")
			setup()
			if errs := o.code(exitUsage, args()...); !strings.Contains(errs, "--reason is required") || w.effect(o) {
				t.Errorf("%s without --reason: %q, effect %v", what, errs, w.effect(o))
			}
			o.rdb.Set(ctx, o.topo.Audit(), "not a stream", 0)
			if errs := o.code(exitRuntime, args("--reason", "fault")...); !strings.Contains(errs, "could not be recorded, so it was not done") || w.effect(o) {
				t.Errorf("%s with the audit stream broken: %q, effect %v", what, errs, w.effect(o))
			}
			o.rdb.Del(ctx, o.topo.Audit())
			o.ok(args("--reason", "step "+what)...)
			if !w.effect(o) {
				t.Errorf("%s did nothing", what)
			}
			var rep web.AuditReport
			o.json(&rep, "audit", "--who", "carol")
			if len(rep.Records) != 1 || rep.Records[0].Reason != "step "+what || !strings.HasPrefix(rep.Records[0].From, "cli ") ||
				rep.Records[0].Outcome != audit.OutcomeDone || rep.Records[0].Scope == "" {
				t.Errorf("%s: audit %+v", what, rep.Records)
			}
			o.rdb.Del(ctx, o.topo.Audit())
			n++
		}
	}
	if n != 10 {
		t.Fatalf("%d writes run, want 10", n)
	}
	// history shows an operator action beside the events; audit filters and
	// prints a table.
	buried := o.bury(o.stream("triage", ""), "RHEL-31", "boom")
	o.ok("dlq", "requeue", buried, "--reason", "agent fixed")
	if out := o.ok("history", "RHEL-31"); !strings.Contains(out, "operator.requeue") || !strings.Contains(out, "agent fixed") {
		t.Errorf("history lacks the operator action:\n%s", out)
	}
	if out := o.ok("audit", "--issue", "rhel-31", "--action", "requeue", "--since", "1h"); !strings.Contains(out, "carol") || !strings.Contains(out, "agent fixed") {
		t.Errorf("audit table:\n%s", out)
	}
	if out := o.ok("audit", "--who", "nobody"); !strings.Contains(out, "no operator writes recorded") {
		t.Errorf("audit of nobody:\n%s", out)
	}
	var rep web.AuditReport
	out := o.ok("audit", "--json")
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Records) != 1 {
		t.Errorf("audit --json: %v %s", err, out)
	}
	o.code(exitUsage, "audit", "--limit", "0")
	o.code(exitUsage, "audit", "--issue", "not a key")
}
