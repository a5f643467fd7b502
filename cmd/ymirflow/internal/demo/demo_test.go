package demo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/demo"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners"
)

// fast are small, quick settings: the whole catalogue with 20ms agents.
func fast(o demo.Options) demo.Options {
	if o.AgentDuration == 0 {
		o.AgentDuration = 20 * time.Millisecond
	}
	if o.Timeout == 0 {
		// A deadline, not a wait: the demo drains in seconds, but this package's demos
		// run side by side under the race detector on a loaded two-core machine.
		o.Timeout = 2 * time.Minute
	}
	return o
}

// streamsAtEnd is what a test reads from the demo's Redis at PhaseDone, before the demo
// closes it.
type streamsAtEnd struct {
	entries  map[string]string   // stream|id of every input entry -> issue key
	outcomes map[string][]string // stream|id -> terminal record types
	dropped  map[string]int      // issue -> lock.dropped records
	dead     map[string]bool     // stream|id of dead letters
	pending  int
	err      error
}

func readStreams(s *demo.Summary) streamsAtEnd {
	ctx := context.Background()
	out := streamsAtEnd{entries: map[string]string{}, outcomes: map[string][]string{}, dropped: map[string]int{}, dead: map[string]bool{}}
	opts, err := pipeline.ClientOptions(s.Redis)
	if err != nil {
		out.err = err
		return out
	}
	rdb := redis.NewUniversalClient(opts)
	defer rdb.Close()
	topo := event.Topology{Namespace: s.Namespace}
	for _, r := range topo.AllInputs() {
		xs, err := rdb.XRange(ctx, r.Stream, "-", "+").Result()
		if err != nil {
			out.err = err
			return out
		}
		for _, x := range xs {
			out.entries[r.Stream+"|"+x.ID], _ = x.Values["m:issue_key"].(string)
		}
		p, err := rdb.XPending(ctx, r.Stream, r.Group).Result()
		if err == nil {
			out.pending += int(p.Count)
		} else if !strings.HasPrefix(err.Error(), "NOGROUP") {
			out.err = err
			return out
		}
	}
	res, err := rdb.XRange(ctx, topo.Results(), "-", "+").Result()
	if err != nil {
		out.err = err
		return out
	}
	for _, x := range res {
		et, _ := x.Values["event_type"].(string)
		key := fmt.Sprint(x.Values["stream"]) + "|" + fmt.Sprint(x.Values["message_id"])
		switch et {
		case event.StageDone, event.StageFailed, event.LockDropped, event.LockDelivered:
			out.outcomes[key] = append(out.outcomes[key], et)
		}
		if et == event.LockDropped {
			out.dropped[fmt.Sprint(x.Values["issue_key"])]++
		}
	}
	dead, err := rdb.XRange(ctx, topo.Dead(), "-", "+").Result()
	if err != nil {
		out.err = err
		return out
	}
	for _, x := range dead {
		out.dead[fmt.Sprint(x.Values[event.DeadFieldStream])+"|"+fmt.Sprint(x.Values[event.DeadFieldID])] = true
	}
	return out
}

// expectedStats derives each stage's numbers from the scenarios alone.
func expectedStats(scen []demo.Scenario, maxRetries int) map[string]demo.StageStats {
	out := map[string]demo.StageStats{}
	bump := func(stage string, published, dropped, retried int, ok bool) {
		st := out[stage]
		st.Stage = stage
		st.Published += published
		st.Run++
		st.Dropped += dropped
		st.Retried += retried
		if ok {
			st.Succeeded++
		} else {
			st.Failed++
			st.Dead++
		}
		out[stage] = st
	}
	for _, s := range scen {
		if s.Published() {
			res, n := s.Resolution(maxRetries)
			dup := 0
			if s.Duplicate {
				dup = 1
			}
			bump("triage", 1+dup, dup, n-1, res != runners.ResolutionError)
			if s.Comment {
				// The maintainer's comment: one more triage event, delivered to the run.
				st := out["triage"]
				st.Published++
				st.Delivered++
				out["triage"] = st
			}
		}
		if agent, branch := s.DownstreamStage(maxRetries); agent != "" {
			copies := 1
			if s.Enqueue != "" {
				copies = 2
			}
			ok, n := s.DownstreamAttempts(maxRetries)
			bump(agent+"-"+branch, copies, copies-1, n-1, ok)
		}
	}
	return out
}

// checkRun checks a complete demo: its summary against the plan, the streams and the fake
// Jira's labels.
func checkRun(t *testing.T, s *demo.Summary, at streamsAtEnd, issues int, seed int64) {
	t.Helper()
	if at.err != nil {
		t.Fatalf("reading the streams at the end: %v", at.err)
	}
	if !s.Complete() {
		var b bytes.Buffer
		s.WriteText(&b, false)
		t.Errorf("summary not complete:\n%s", b.String())
	}
	scen := demo.Scenarios(issues, seed)
	checkOutcomes(t, s, at)
	checkDrops(t, s, at, scen)
	checkStages(t, s, scen)
	checkLabels(t, s, scen, issues)
	checkFollowupsAndSweeps(t, s, scen)
}

// checkOutcomes is checkRun's first part: every published event has exactly one outcome;
// a failed one is also dead.
func checkOutcomes(t *testing.T, s *demo.Summary, at streamsAtEnd) {
	t.Helper()
	if len(at.entries) != s.Total.Published {
		t.Errorf("%d entries in the input streams, summary says %d published", len(at.entries), s.Total.Published)
	}
	for e, key := range at.entries {
		if got := at.outcomes[e]; len(got) != 1 {
			t.Errorf("entry %s (%s) has outcomes %v, want exactly one", e, key, got)
		} else if (got[0] == event.StageFailed) != at.dead[e] {
			t.Errorf("entry %s (%s): outcome %s, dead letter %v", e, key, got[0], at.dead[e])
		}
	}
	for e := range at.outcomes {
		if _, ok := at.entries[e]; !ok {
			t.Errorf("an outcome about %s, which is no input entry", e)
		}
	}
	if at.pending != 0 || s.Total.Pending != 0 {
		t.Errorf("pending entries left: streams %d, summary %d", at.pending, s.Total.Pending)
	}

}

// checkDrops is checkRun's second part: dropped events are exactly the deliberate
// duplicates, one per duplicated issue.
func checkDrops(t *testing.T, s *demo.Summary, at streamsAtEnd, scen []demo.Scenario) {
	t.Helper()
	var dups []string
	for _, sc := range scen {
		if (sc.Duplicate && sc.Published()) || sc.Enqueue != "" {
			dups = append(dups, sc.Key)
		}
	}
	slices.Sort(dups)
	if !slices.Equal(dups, s.Duplicates.Keys) {
		t.Errorf("duplicates %v, want %v", s.Duplicates.Keys, dups)
	}
	total := 0
	for key, n := range at.dropped {
		total += n
		if n != 1 || !slices.Contains(dups, key) {
			t.Errorf("%s dropped %d times; duplicated on purpose: %v", key, n, slices.Contains(dups, key))
		}
	}
	if total != len(dups) || s.Total.Dropped != len(dups) {
		t.Errorf("dropped: streams %d, summary %d, want the %d duplicates", total, s.Total.Dropped, len(dups))
	}

}

// checkStages is checkRun's third part: each stage's numbers are what the plan says.
func checkStages(t *testing.T, s *demo.Summary, scen []demo.Scenario) {
	t.Helper()
	want := expectedStats(scen, s.MaxRetries)
	for _, st := range s.Stages {
		w := want[st.Stage]
		w.Stage, w.Outcomes, w.Pending, w.Running = st.Stage, st.Published, 0, 0
		// Retried counts handler calls after an event's first. The plan's failures are
		// the least of them: a Redis command timing out on a loaded machine fails an
		// attempt too, and the handler is called again (its runner is not re-run once it
		// has a result, and no outcome is recorded twice: the checks above hold that).
		if st.Retried > w.Retried {
			t.Logf("stage %s: %d handler retries, %d of them planned; the rest followed transient errors", st.Stage, st.Retried, w.Retried)
			w.Retried = st.Retried
		}
		if st != w {
			t.Errorf("stage %s:\n got %+v\nwant %+v", st.Stage, st, w)
		}
	}

}

// checkLabels is checkRun's fourth part: the fake Jira's labels at the end are the
// plan's, issue by issue.
func checkLabels(t *testing.T, s *demo.Summary, scen []demo.Scenario, issues int) {
	t.Helper()
	if len(s.IssueResults) != issues {
		t.Fatalf("%d issue results, want %d", len(s.IssueResults), issues)
	}
	byKey := map[string]demo.IssueResult{}
	for _, ir := range s.IssueResults {
		byKey[ir.Key] = ir
		if !slices.Equal(ir.Labels, ir.Expected) {
			t.Errorf("%s (%s): labels %v, want %v", ir.Key, ir.Path, ir.Labels, ir.Expected)
		}
	}
	// A few by hand, independent of ExpectedLabels.
	for _, sc := range scen {
		got := byKey[sc.Key].Labels
		switch {
		case sc.Kind == fakejira.SampleModular || sc.Kind == fakejira.SampleModularTodo:
			if len(got) != 0 {
				t.Errorf("%s (modular): labels %v, want none", sc.Key, got)
			}
		case sc.Kind == fakejira.SampleTodoOutsider:
			if slices.Contains(got, "ymir_todo") {
				t.Errorf("%s: the outsider's ymir_todo is still there: %v", sc.Key, got)
			}
		case len(sc.Triage) > 0 && !slices.ContainsFunc(sc.Triage, func(r string) bool { return r != "error" }):
			if !slices.Equal(got, []string{"ymir_triage_errored"}) {
				t.Errorf("%s (triage always errors): labels %v", sc.Key, got)
			}
		case len(sc.Downstream) > 0 && !slices.Contains(sc.Downstream, "success"):
			agent, _ := sc.DownstreamStage(s.MaxRetries)
			if !slices.Equal(got, []string{"ymir_" + agent + "_errored"}) {
				t.Errorf("%s (%s always fails): labels %v", sc.Key, agent, got)
			}
		}
	}

}

// checkFollowupsAndSweeps is checkRun's last part: each planned comment reached its
// running agent, redacted, the account's own comments never did; the second sweep found
// nothing new.
func checkFollowupsAndSweeps(t *testing.T, s *demo.Summary, scen []demo.Scenario) {
	t.Helper()
	// Each planned comment reached its running agent, redacted; the account's own
	// comments never did.
	var commented []string
	for _, sc := range scen {
		if sc.Comment && sc.Published() {
			commented = append(commented, sc.Key)
		}
	}
	if len(s.Followups) != len(commented) || s.OwnComments != len(commented) || s.Total.Delivered != len(commented) {
		t.Errorf("follow-ups %+v, own comments ignored %d, delivered %d: want one each for %v", s.Followups, s.OwnComments, s.Total.Delivered, commented)
	}
	for i, f := range s.Followups {
		if f.Key != commented[i] || !f.Delivered() || f.Stage != "triage" || f.CommentID == "" ||
			f.Author != fakejira.SampleMaintainer.AccountID || !strings.Contains(f.Body, "[redacted]") || strings.Contains(f.Body, "ghp_") {
			t.Errorf("follow-up %+v: want %s's maintainer comment delivered to its triage run, its token redacted", f, commented[i])
		}
	}

	// The second sweep found nothing new.
	if len(s.Sweeps) != 2 || s.Sweeps[1].Published != 0 {
		t.Errorf("sweeps: %+v, want a second one that publishes nothing", s.Sweeps)
	}
	if s.Sweeps[0].Published+s.Duplicates.Triage+len(commented) != mustStage(t, s, "triage").Published {
		t.Errorf("first sweep published %d, plus %d duplicates and %d comments; triage streams hold %d", s.Sweeps[0].Published,
			s.Duplicates.Triage, len(commented), mustStage(t, s, "triage").Published)
	}
}

func mustStage(t *testing.T, s *demo.Summary, name string) demo.StageStats {
	st, ok := s.Stage(name)
	if !ok {
		t.Fatalf("no stage %s in the summary", name)
	}
	return st
}

// runDemo runs a demo and reads its streams at the end.
func runDemo(t *testing.T, o demo.Options) (*demo.Summary, streamsAtEnd, error) {
	t.Helper()
	var at streamsAtEnd
	o.OnPhase = func(p string, s *demo.Summary) {
		if p == demo.PhaseDone {
			at = readStreams(s)
		}
	}
	s, err := demo.Run(context.Background(), fast(o))
	return s, at, err
}

// TestDemoEmbedded counts the process's goroutines, so it stays serial, like
// TestDemoInterrupted.
func TestDemoEmbedded(t *testing.T) {
	before := runtime.NumGoroutine()
	var out, progress bytes.Buffer
	s, at, err := runDemo(t, demo.Options{Issues: demo.CatalogueSize, Seed: 7, Out: &out, Progress: &progress,
		ProgressEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("demo: %v\n%s%s", err, progress.String(), out.String())
	}
	if !s.Embedded || s.Namespace != event.DefaultNamespace {
		t.Errorf("embedded %v, namespace %q", s.Embedded, s.Namespace)
	}
	checkRun(t, s, at, demo.CatalogueSize, 7)
	for _, want := range []string{"sweep 1: found 40, published", "sweep 2: found 40, published 0", "nothing new",
		"published on purpose: 4 triage requests a second time, 6 downstream requests enqueued twice"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	for _, want := range []string{"published  run  dropped  delivered  retried  succeeded  failed  dead", "rebuild-c10s",
		"ok     every published event has exactly one outcome", "ok     Jira labels as planned for 40 of 40 issues",
		"ok     follow-ups: 1 of 1 maintainer comments made during a run reached the running agent (1 of ymirflow's own account's not delivered)",
		"comments during triage",
		"ymirflow history RHEL-", "ymirflow pending", "ymirflow locks"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "NOT OK") {
		t.Errorf("report has a failed check:\n%s", out.String())
	}
	waitGoroutines(t, before)
}

// More issues than the catalogue: the rest are random, and still accounted for.
func TestDemoRandomScenarios(t *testing.T) {
	t.Parallel()
	s, at, err := runDemo(t, demo.Options{Issues: demo.CatalogueSize + 20, Seed: 3, AgentDuration: -1})
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, s, at, demo.CatalogueSize+20, 3)
}

func TestDemoRealRedis(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Client(t) // fails with a clear line when no Redis answers
	var out bytes.Buffer
	s, at, err := runDemo(t, demo.Options{RedisURL: redistest.URL(), Issues: demo.CatalogueSize, Seed: 11, Out: &out})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if s.Embedded || !strings.HasPrefix(s.Namespace, "ymir-demo-") {
		t.Errorf("embedded %v, namespace %q: want a fresh ymir-demo-* namespace", s.Embedded, s.Namespace)
	}
	checkRun(t, s, at, demo.CatalogueSize, 11)
	if !strings.Contains(out.String(), "REDIS_URL="+redistest.URL()+" YMIR_NAMESPACE="+s.Namespace+" ymirflow history RHEL-") {
		t.Errorf("report lacks the inspection commands for the namespace:\n%s", out.String())
	}
	// The namespace is gone (no --keep).
	keys, err := rdb.Keys(context.Background(), "*"+s.Namespace+"*").Result()
	if err != nil || len(keys) > 0 {
		t.Errorf("namespace %s left %d keys (%v), e.g. %v", s.Namespace, len(keys), err, keys[:min(3, len(keys))])
	}
}

func TestDemoRealRedisKeepAndUsedNamespace(t *testing.T) {
	t.Parallel()
	rdb, ns := redistest.Client(t)
	ns = strings.TrimSuffix(ns, ":") // the demo appends ":" to its namespace
	s, _, err := runDemo(t, demo.Options{RedisURL: redistest.URL(), Namespace: ns, Issues: 6, Keep: true, AgentDuration: -1})
	if err != nil {
		t.Fatal(err)
	}
	if s.Namespace != ns || !s.Complete() {
		t.Fatalf("namespace %q, complete %v", s.Namespace, s.Complete())
	}
	if n, _ := rdb.Exists(context.Background(), ns+":results").Result(); n != 1 {
		t.Errorf("--keep: %s:results is gone", ns)
	}
	// The namespace now holds keys: a second demo refuses it rather than mixing in.
	_, err = demo.Run(context.Background(), demo.Options{RedisURL: redistest.URL(), Namespace: ns, Issues: 6})
	if err == nil || !strings.Contains(err.Error(), "already holds keys") {
		t.Errorf("demo in a used namespace: %v", err)
	}
}

// Cancelling the context mid-run stops the demo cleanly: ErrInterrupted, routers closed,
// no goroutine left, no panic.
// TestDemoInterrupted counts the process's goroutines, so it must not run beside the
// package's parallel tests: it stays serial (serial tests finish before parallel ones start).
func TestDemoInterrupted(t *testing.T) {
	for _, where := range []string{"embedded", "real"} {
		t.Run(where, func(t *testing.T) {
			url := ""
			if where == "real" {
				redistest.Client(t)
				url = redistest.URL()
			}
			before := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			var progress bytes.Buffer
			start := time.Now()
			var stoppedAt time.Time
			s, err := demo.Run(ctx, demo.Options{RedisURL: url, Issues: demo.CatalogueSize, AgentDuration: 300 * time.Millisecond,
				Progress: &progress, Out: &progress, OnPhase: func(p string, _ *demo.Summary) {
					if p == demo.PhaseWorkers {
						once.Do(func() {
							time.AfterFunc(400*time.Millisecond, func() { stoppedAt = time.Now(); cancel() })
						})
					}
				}})
			took := time.Since(start)
			if !errors.Is(err, demo.ErrInterrupted) {
				t.Fatalf("err = %v, want ErrInterrupted\n%s", err, progress.String())
			}
			if !s.Interrupted || s.Complete() {
				t.Errorf("summary: interrupted %v, complete %v", s.Interrupted, s.Complete())
			}
			if stop := time.Since(stoppedAt); stop > 5*time.Second {
				t.Errorf("took %s to stop after the cancel (%s in all)", stop, took)
			}
			if !strings.Contains(progress.String(), "Interrupted after") {
				t.Errorf("no line saying it was interrupted:\n%s", progress.String())
			}
			if s.Total.Run == 0 {
				t.Errorf("nothing ran before the cancel:\n%s", progress.String())
			}
			waitGoroutines(t, before)
		})
	}
}

// waitGoroutines fails the test when goroutines started since before are still alive.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			var b bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines left running (%d before):\n%s", runtime.NumGoroutine(), before, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestScenariosCoverEveryPath(t *testing.T) {
	t.Parallel()
	scen := demo.Scenarios(demo.CatalogueSize, 1)
	kinds := map[fakejira.SampleKind]bool{}
	resolutions := map[string]bool{}
	stages := map[string]bool{}
	var paths []string
	keys := map[string]bool{}
	for _, s := range scen {
		if keys[s.Key] {
			t.Errorf("key %s twice", s.Key)
		}
		keys[s.Key] = true
		kinds[s.Kind] = true
		for _, r := range s.Triage {
			resolutions[r] = true
		}
		if a, b := s.DownstreamStage(3); a != "" {
			stages[a+"-"+b] = true
		}
		paths = append(paths, s.Path(3))
	}
	for _, k := range fakejira.SampleKinds {
		if !kinds[k] {
			t.Errorf("no scenario of kind %s", k)
		}
	}
	for _, r := range runners.Resolutions {
		if !resolutions[r] {
			t.Errorf("no scenario resolves to %s", r)
		}
	}
	for _, a := range []string{"rebase", "backport", "rebuild"} {
		for _, b := range []string{"c9s", "c10s"} {
			if !stages[a+"-"+b] {
				t.Errorf("no scenario reaches %s-%s", a, b)
			}
		}
	}
	all := strings.Join(paths, "\n")
	for _, want := range []string{"failure, success", "crash, success", "(dead)", "triage: error ×3 (dead)",
		"triage: error ×1, then", "published twice", "enqueued twice by hand", "no target branch", "todo →"} {
		if !strings.Contains(all, want) {
			t.Errorf("no scenario path with %q:\n%s", want, all)
		}
	}
	// The same seed deals the same keys; another deals them differently.
	again := demo.Scenarios(demo.CatalogueSize, 1)
	other := demo.Scenarios(demo.CatalogueSize, 2)
	same, differ := true, false
	for i := range scen {
		same = same && scen[i].Path(3) == again[i].Path(3)
		differ = differ || scen[i].Path(3) != other[i].Path(3)
	}
	if !same || !differ {
		t.Errorf("seeding: same seed alike %v, other seed differs %v", same, differ)
	}
	if n := len(demo.Scenarios(12, 1)); n != 12 {
		t.Errorf("Scenarios(12) gave %d", n)
	}
}
