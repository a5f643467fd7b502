package fetcher

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/internal/redistest"
	"github.com/ymirflow/ymirflow/internal/xonce"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
)

// A lease at any stage, not only triage's, keeps the issue and its trigger untouched; the
// sweep after the release publishes it.
func TestLockedAtEveryStageKeepsTriggerUntilRelease(t *testing.T) {
	for _, stage := range event.Agents {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, []fakejira.Issue{todoBy(iss("RHEL-7"), member), iss("RHEL-8", labels.RetryNeeded), iss("RHEL-9")})
			for _, k := range []string{"RHEL-7", "RHEL-8", "RHEL-9"} {
				if _, err := h.locker.Acquire(h.ctx, stage, k, lease.AcquireOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			s := h.sweep()
			if s.Published != 0 || s.Skipped[ReasonLocked] != 3 || len(h.published()) != 0 {
				t.Fatalf("locked sweep: %s, streams %v", s, h.published())
			}
			if len(h.srv.Writes()) != 0 || len(h.changelogReads("")) != 0 {
				t.Errorf("a locked issue was touched: writes %v", h.srv.Writes())
			}
			for _, k := range []string{"RHEL-7", "RHEL-8", "RHEL-9"} {
				if o, _ := s.Outcome(k); o.Stage != stage {
					t.Errorf("%s: outcome %+v", k, o)
				}
				if _, err := h.locker.ForceRelease(h.ctx, stage, k); err != nil {
					t.Fatal(err)
				}
			}
			s = h.sweep()
			if got := h.published(); !slices.Equal(got, []string{"RHEL-7@todo", "RHEL-8@triage", "RHEL-9@triage"}) {
				t.Errorf("after release: %v (%s)", got, s)
			}
			wantLabels("RHEL-7", labels.TriageInProgress)(t, h, s)
			wantLabels("RHEL-8", labels.TriageInProgress)(t, h, s)
		})
	}
}

// If the publish fails (Redis stopped at that very moment), no label is flipped, and the
// sweep stops with an error.
func TestPublishFailureFlipsNoLabel(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DisableIdentity: true, MaxRetries: 1,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	var once sync.Once
	rdb.AddHook(stopOnPublish{stop: func() { once.Do(srv.Stop) }})
	h := newHarness(t, []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded), todoBy(iss("RHEL-2"), member), updated(iss("RHEL-3", "ymir_triaged_rebase"), 48*time.Hour)},
		withRedis(rdb))
	s, err := h.fetcher().Sweep(h.ctx)
	if err == nil || !strings.Contains(err.Error(), "no label was changed") || Fatal(err) {
		t.Fatalf("sweep error %v", err)
	}
	if n := len(h.requests(http.MethodPut, "")); n != 0 {
		t.Errorf("%d Jira writes after a failed publish", n)
	}
	wantLabels("RHEL-1", labels.RetryNeeded)(t, h, s)
	wantLabels("RHEL-2", labels.Todo)(t, h, s)
	wantLabels("RHEL-3", "ymir_triaged_rebase")(t, h, s)
	if s.Published != 0 || s.Skipped[ReasonError] != 3 {
		t.Errorf("summary %s", s)
	}
}

// stopOnPublish stops the Redis server just before the publish script is sent.
type stopOnPublish struct{ stop func() }

func (stopOnPublish) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s stopOnPublish) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			s.stop()
		}
		return next(ctx, cmd)
	}
}
func (stopOnPublish) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Two sweeps in a row publish each issue once; once the worker has acked an entry, an
// issue that still qualifies is published again.
func TestTwoSweepsPublishOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2"), todoBy(iss("RHEL-3"), member), iss("RHEL-4", labels.RetryNeeded)})
	s1 := h.sweep()
	s2 := h.sweep()
	want := []string{"RHEL-1@triage", "RHEL-2@triage", "RHEL-3@todo", "RHEL-4@triage"}
	if got := h.published(); !slices.Equal(got, want) {
		t.Fatalf("after two sweeps: %v, want %v", got, want)
	}
	if s1.Published != 4 || s2.Published != 0 || s2.Skipped[ReasonQueued] != 2 || s2.Skipped[ReasonLabelled] != 2 {
		t.Errorf("sweep 1: %s\nsweep 2: %s", s1, s2)
	}
	// A worker delivers them (pending): still queued.
	h.deliver()
	if s := h.sweep(); s.Published != 0 || s.Skipped[ReasonQueued] != 2 {
		t.Errorf("while pending: %s", s)
	}
	// ... and acks them without touching Jira (e.g. dropped): the fresh ones come back.
	h.consume()
	h.deliver() // ack the pending ones too
	for _, todo := range []bool{true, false} {
		st := h.topo.Stream("triage", "", todo)
		pe, _ := h.rdb.XPendingExt(h.ctx, &redis.XPendingExtArgs{Stream: st, Group: "triage", Start: "-", End: "+", Count: 100}).Result()
		for _, p := range pe {
			h.rdb.XAck(h.ctx, st, "triage", p.ID)
		}
	}
	if s := h.sweep(); !slices.Equal(s.PublishedKeys(), []string{"RHEL-1", "RHEL-2"}) {
		t.Errorf("after ack: published %v (%s)", s.PublishedKeys(), s)
	}
	if ttl := h.rdb.PTTL(h.ctx, h.topo.Queued("triage", "RHEL-1")).Val(); ttl <= 23*time.Hour || ttl > 24*time.Hour {
		t.Errorf("marker TTL %s, want the 24h default", ttl)
	}
	// Each publish is in its issue's index of its stream (written by the publish script).
	for _, todo := range []bool{true, false} {
		st := h.topo.Stream("triage", "", todo)
		for _, m := range h.rdb.XRange(h.ctx, st, "-", "+").Val() {
			key := event.EntryIssue(st, m.ID, m.Values)
			idx := h.rdb.ZRange(h.ctx, xonce.IndexKey(st, key), 0, -1).Val()
			if !slices.ContainsFunc(idx, func(s string) bool { return xonce.IndexID(s) == m.ID }) {
				t.Errorf("%s %s (%s) not in its index %v", st, m.ID, key, idx)
			}
		}
	}
}

// Sweeps racing from two processes publish each issue once (the check and the XADD are
// one script).
func TestConcurrentSweepsPublishOnce(t *testing.T) {
	t.Parallel()
	var issues []fakejira.Issue
	for i := 1; i <= 30; i++ {
		issues = append(issues, iss("RHEL-"+strconv.Itoa(i)))
	}
	h := newHarness(t, issues)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := h.fetcher().Sweep(h.ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := h.published(); len(got) != 30 || len(slices.Compact(got)) != 30 {
		t.Errorf("%d entries for 30 issues: %v", len(got), got)
	}
}

// DRY_RUN writes nothing to Jira (no PUT at all) but publishes to the right streams.
func TestDryRunWritesNothingButPublishes(t *testing.T) {
	t.Parallel()
	issues := fakejira.SampleIssues(len(fakejira.SampleKinds), 1)
	h := newHarness(t, issues, withFake(func(o *fakejira.Options) { o.Groups = fakejira.SampleGroups() }))
	s := h.sweep(func(c *Config) { c.DryRun = true })
	if n := len(h.requests(http.MethodPut, "")) + len(h.requests(http.MethodPost, "/comment")); n != 0 {
		t.Errorf("%d Jira writes in dry run", n)
	}
	for _, is := range issues {
		if got := h.srv.Labels(is.Key); !slices.Equal(got, is.Labels) {
			t.Errorf("%s: labels %v changed from %v", is.Key, got, is.Labels)
		}
	}
	if s.Published != 5 || !s.DryRun {
		t.Errorf("dry run: %s", s)
	}
	// A client in dry-run mode implies it too.
	h2 := newHarness(t, []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded)}, withJira(func(o *jira.Options) { o.DryRun = true }))
	if s := h2.sweep(); !s.DryRun || s.Published != 1 || len(h2.requests(http.MethodPut, "")) != 0 {
		t.Errorf("client dry run: %s", s)
	}
}

// Every sample kind gets what the rules say.
func TestSampleIssuesSweep(t *testing.T) {
	t.Parallel()
	issues := fakejira.SampleIssues(len(fakejira.SampleKinds), 3)
	h := newHarness(t, issues, withFake(func(o *fakejira.Options) { o.Groups = fakejira.SampleGroups() }))
	s := h.sweep(func(c *Config) { c.TriggerGroup = fakejira.SampleTriggerGroup })
	want := map[fakejira.SampleKind]struct {
		reason Reason
		stream string
		labels []string
	}{
		fakejira.SampleFresh:          {"", "triage", nil},
		fakejira.SampleTodo:           {"", "todo", []string{labels.TriageInProgress}},
		fakejira.SampleTodoOutsider:   {ReasonUntrusted, "", nil},
		fakejira.SampleRetry:          {"", "triage", []string{labels.TriageInProgress}},
		fakejira.SampleStaleInFlight:  {"", "triage", []string{labels.TriageInProgress}},
		fakejira.SampleStaleTriaged:   {"", "triage", []string{labels.TriageInProgress}},
		fakejira.SampleFreshInFlight:  {ReasonLabelled, "", []string{labels.TriageInProgress}},
		fakejira.SampleModular:        {ReasonModular, "", nil},
		fakejira.SampleModularTodo:    {ReasonModular, "", nil},
		fakejira.SampleTriaged:        {ReasonLabelled, "", nil},
		fakejira.SampleDone:           {ReasonLabelled, "", nil},
		fakejira.SampleTodoInProgress: {ReasonLabelled, "", []string{labels.TriageInProgress, labels.Todo}},
		fakejira.SampleRetryInFlight:  {ReasonLabelled, "", []string{labels.TriageInProgress, labels.RetryNeeded}},
	}
	for _, is := range issues {
		kind := fakejira.SampleKindOf(is)
		w := want[kind]
		o, _ := s.Outcome(is.Key)
		if o.Reason != w.reason || o.Published != (w.stream != "") || (w.stream == "todo") != strings.HasSuffix(o.Stream, ":todo") {
			t.Errorf("%s (%s): outcome %+v, want reason %q stream %q", is.Key, kind, o, w.reason, w.stream)
		}
		if kind == fakejira.SampleTriaged || kind == fakejira.SampleDone {
			continue // random outcome labels, unchanged
		}
		got := h.labels(is.Key)
		wl := slices.Clone(w.labels)
		slices.Sort(wl)
		if !slices.Equal(got, wl) {
			t.Errorf("%s (%s): labels %v, want %v", is.Key, kind, got, wl)
		}
	}
}

// A 429 with Retry-After is waited out; a permanent one fails the sweep (see the upstream
// port); a 401 or 403 on the search is fatal.
func TestJiraErrors(t *testing.T) {
	t.Parallel()
	t.Run("429 Retry-After", func(t *testing.T) {
		h := newHarness(t, []fakejira.Issue{iss("RHEL-1")})
		h.srv.FailNext(1, http.StatusTooManyRequests, "1")
		start := time.Now()
		s := h.sweep()
		if took := time.Since(start); took < 900*time.Millisecond || s.Published != 1 {
			t.Errorf("took %s (Retry-After 1s), %s", took, s)
		}
	})
	for _, st := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.Run(http.StatusText(st), func(t *testing.T) {
			h := newHarness(t, []fakejira.Issue{iss("RHEL-1")})
			h.srv.FailNext(1, st, "")
			_, err := h.fetcher().Sweep(h.ctx)
			if err == nil || !Fatal(err) || !strings.Contains(err.Error(), http.StatusText(st)) {
				t.Errorf("sweep error %v, want a fatal %d", err, st)
			}
			if len(h.published()) != 0 {
				t.Error("published after a refused search")
			}
		})
	}
	t.Run("401 on the author check ends the sweep", func(t *testing.T) {
		h := newHarness(t, []fakejira.Issue{todoBy(iss("RHEL-1"), member), iss("RHEL-2")})
		h.failPath["/issue/RHEL-1"] = http.StatusUnauthorized
		s, err := h.fetcher().Sweep(h.ctx)
		if !Fatal(err) || s.Published != 0 {
			t.Errorf("err %v, %s", err, s)
		}
		wantLabels("RHEL-1", labels.Todo)(t, h, s)
	})
	t.Run("author check 5xx skips the issue only", func(t *testing.T) {
		h := newHarness(t, []fakejira.Issue{todoBy(iss("RHEL-1"), member), iss("RHEL-2")})
		h.failPath["/issue/RHEL-1"] = http.StatusBadGateway
		s := h.sweep()
		if o, _ := s.Outcome("RHEL-1"); o.Reason != ReasonError || !slices.Equal(s.PublishedKeys(), []string{"RHEL-2"}) {
			t.Errorf("outcome %+v, %s", o, s)
		}
		wantLabels("RHEL-1", labels.Todo)(t, h, s)
		delete(h.failPath, "/issue/RHEL-1")
		if s := h.sweep(); !slices.Equal(s.PublishedKeys(), []string{"RHEL-1"}) {
			t.Errorf("next sweep: %s", s)
		}
	})
}

// A modular ymir_todo is consumed at once, without an author check,
// rather than re-checked every sweep for ever.
func TestModularTodoIsConsumed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{component(todoBy(iss("RHEL-1"), member), "perl:5.32/perl"), component(todoBy(iss("RHEL-2"), outsider), "nodejs:18/nodejs")})
	s := h.sweep()
	if s.Skipped[ReasonModular] != 2 || s.Published != 0 {
		t.Errorf("%s", s)
	}
	for _, k := range []string{"RHEL-1", "RHEL-2"} {
		if got := h.writes(k); !slices.Equal(got, []string{"-ymir_todo"}) {
			t.Errorf("%s: writes %v", k, got)
		}
	}
	noAuthorCheck(t, h, s)
	if s := h.sweep(); s.Skipped[ReasonModular] != 2 || len(h.srv.Writes()) != 2 {
		t.Errorf("second sweep: %s, writes %v", s, h.srv.Writes())
	}
}

// Keys are canonicalised before any lookup: a lease on RHEL-5 covers " rhel-5"; invalid
// keys are skipped.
func TestCanonicalKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{iss("rhel-5"), iss(" Rhel-6"), iss("../x"), iss("RHEL-0")})
	if _, err := h.locker.Acquire(h.ctx, "rebase", "RHEL-5", lease.AcquireOptions{}); err != nil {
		t.Fatal(err)
	}
	s := h.sweep()
	if got := h.published(); !slices.Equal(got, []string{"RHEL-6@triage"}) {
		t.Errorf("published %v", got)
	}
	if s.Skipped[ReasonLocked] != 1 || s.Skipped[ReasonInvalidKey] != 2 {
		t.Errorf("%s", s)
	}
}

// A marker whose stream was deleted or whose entry was trimmed does not block; a marker
// of an entry still waiting does.
func TestQueuedMarkerLifecycle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2")})
	if s := h.sweep(); s.Published != 2 {
		t.Fatal(s)
	}
	stream := h.topo.Stream("triage", "", false)
	// Trim RHEL-1's entry away (XTRIM MINID past it), keep RHEL-2's.
	xs := h.rdb.XRange(h.ctx, stream, "-", "+").Val()
	h.rdb.XTrimMinID(h.ctx, stream, xs[1].ID)
	s := h.sweep()
	if !slices.Equal(s.PublishedKeys(), []string{"RHEL-1"}) || s.Skipped[ReasonQueued] != 1 {
		t.Errorf("after trim: %s", s)
	}
	h.rdb.Del(h.ctx, stream)
	if s := h.sweep(); s.Published != 2 {
		t.Errorf("after the stream was deleted: %s", s)
	}
	// A marker that is not ours (garbage) is ignored.
	h.rdb.Set(h.ctx, h.topo.Queued("triage", "RHEL-1"), "garbage", time.Hour)
	h.rdb.Del(h.ctx, stream)
	if s := h.sweep(); s.Published != 2 {
		t.Errorf("garbage marker: %s", s)
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Client(t)
	jc, _ := jira.New(jira.Options{})
	ok := Config{Jira: jc, Redis: rdb, JQL: "x"}
	for name, mod := range map[string]func(*Config){
		"no jira":        func(c *Config) { c.Jira = nil },
		"no redis":       func(c *Config) { c.Redis = nil },
		"no jql":         func(c *Config) { c.JQL = "" },
		"max issues":     func(c *Config) { c.MaxIssues = -1 },
		"threshold":      func(c *Config) { c.StaleLabelThreshold = -time.Second },
		"queued ttl":     func(c *Config) { c.QueuedTTL = time.Microsecond },
		"negative maxln": func(c *Config) { c.MaxLen = -1 },
	} {
		c := ok
		mod(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cl.Close()
	// Redis Cluster is served: its markers sit beside their streams, its leases are
	// hash-tagged (integration's TestClusterPipeline runs it on a real cluster).
	fc, err := New(Config{Jira: jc, Redis: cl, JQL: "x"})
	if err != nil || !fc.cluster || fc.locker.Format() != lease.KeysCluster ||
		fc.markerKey("ymir:triage:todo", "RHEL-1") != "{ymir:triage:todo}:queued:triage:RHEL-1" {
		t.Errorf("cluster client: %v", err)
	}
	f, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if f.threshold != DefaultStaleLabelThreshold || f.queuedTTL != DefaultQueuedTTL || f.componentField != DefaultComponentField ||
		!slices.Equal(f.stages, event.Agents) || f.group != "triage" || !f.dryRun {
		t.Errorf("defaults: %+v", f)
	}
	if got := f.locker.Keys("triage", "RHEL-1").Lock; got != "lock:triage:RHEL-1" {
		t.Errorf("default lease key %q", got)
	}
	if (event.Topology{}).Queued("triage", "RHEL-1") != "ymir:queued:triage:RHEL-1" {
		t.Error("Topology.Queued")
	}
}

// MAX_LEN trims the triage streams after a sweep with event.Trim: entries still waiting
// are never cut, acked ones are (approximately: whole macro nodes).
func TestTrimKeepsWaitingEntries(t *testing.T) {
	t.Parallel()
	const n = 300
	var issues []fakejira.Issue
	for i := 1; i <= n; i++ {
		issues = append(issues, iss("RHEL-"+strconv.Itoa(i)))
	}
	h := newHarness(t, issues)
	h.deliver() // the triage group exists, nothing delivered yet
	stream := h.topo.Stream("triage", "", false)
	maxLen := func(c *Config) { c.MaxLen = 10 }
	if s := h.sweep(maxLen); s.Published != n {
		t.Fatal(s)
	}
	if got := h.rdb.XLen(h.ctx, stream).Val(); got != n {
		t.Errorf("%d entries: undelivered entries were trimmed", got)
	}
	h.consume()
	s := h.sweep(maxLen)
	if s.Published != n {
		t.Fatal(s)
	}
	first, _ := s.Outcome("RHEL-1")
	if got := h.rdb.XLen(h.ctx, stream).Val(); got >= 2*n || got < n {
		t.Errorf("%d entries after the second sweep: want the %d waiting ones and few acked ones", got, n)
	}
	if got := len(h.rdb.XRange(h.ctx, stream, first.EntryID, "+").Val()); got != n {
		t.Errorf("%d of the %d waiting entries left", got, n)
	}
}

// The publish script runs and its reply is lost: go-redis sends it again, and the
// repeat finds the entry it made (by the message's UUID) and reports a publish, so the
// issue is published once and its trigger label flipped, as after any publish.
func TestPublishReplyLostPublishesOnceAndFlips(t *testing.T) {
	t.Parallel()
	direct, _ := redistest.Client(t)
	if err := direct.ScriptLoad(context.Background(), publishLua).Err(); err != nil {
		t.Fatal(err)
	}
	proxy := redistest.NewLossyProxy(t, direct.Options().Addr)
	uo, err := pipeline.ClientOptions(proxy.URL(direct.Options().DB))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(uo.Simple())
	t.Cleanup(func() { rdb.Close() })
	h := newHarness(t, []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded)}, withRedis(rdb))
	proxy.LoseReply(redistest.Script(publishLua), 1)
	s := h.sweep()
	if proxy.Cuts() != 1 {
		t.Fatalf("the publish's reply was not lost (%d cuts)", proxy.Cuts())
	}
	if got := h.published(); !slices.Equal(got, []string{"RHEL-1@triage"}) || s.Published != 1 {
		t.Fatalf("published %v (%s), want RHEL-1 once", got, s)
	}
	if slices.Contains(h.labels("RHEL-1"), labels.RetryNeeded) {
		t.Errorf("trigger label not flipped after the publish: %v", h.labels("RHEL-1"))
	}
}

// An issue whose shared issue key (LOCK_SCOPE issue) is held is locked for every agent
// that shares it: the pre-check reads that key too, so a run the per-agent keys do not
// show (an agent the fetcher does not know, or a lease whose keys sit in the shared
// key's Cluster slot) still keeps the issue untouched.
func TestSharedIssueKeyLocksIssue(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{iss("RHEL-7"), iss("RHEL-8")})
	le, err := h.locker.Acquire(h.ctx, "reproducer", "RHEL-7", lease.AcquireOptions{
		Shared: []lease.ScopeKey{{Scope: lease.ScopeIssue, Key: "RHEL-7"}}})
	if err != nil {
		t.Fatal(err)
	}
	s := h.sweep()
	if o, _ := s.Outcome("RHEL-7"); o.Reason != ReasonLocked || o.Stage != StageIssueScope {
		t.Fatalf("RHEL-7: outcome %+v, want locked by the issue scope (%s)", o, s)
	}
	if got := h.published(); !slices.Equal(got, []string{"RHEL-8@triage"}) {
		t.Fatalf("published %v, want RHEL-8 only", got)
	}
	if _, err := le.Release(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.sweep()
	if got := h.published(); !slices.Equal(got, []string{"RHEL-7@triage", "RHEL-8@triage"}) {
		t.Errorf("after the release: %v", got)
	}
}

// TestParkedForBudgetIsNotRerun: an issue parked for its budget (ymir_budget_exhausted)
// is published by no sweep, whatever trigger it also carries (ymir_retry_needed, a
// maintainer's ymir_todo, a stale reproducer label), and its labels are left alone:
// only a budget approval (the webhook) resumes it. The same issues without the park
// label are published.
func TestParkedForBudgetIsNotRerun(t *testing.T) {
	t.Parallel()
	parked := []fakejira.Issue{
		iss("RHEL-1", labels.BudgetExhausted, labels.RetryNeeded),
		todoBy(iss("RHEL-2", labels.BudgetExhausted), member),
		updated(iss("RHEL-3", labels.BudgetExhausted, labels.ReproducerInProgress), 100*time.Hour),
	}
	h := newHarness(t, append(parked, iss("RHEL-4", labels.RetryNeeded)))
	s := h.sweep()
	if s.Published != 1 || s.Skipped[ReasonLabelled] != 3 || !slices.Equal(h.published(), []string{"RHEL-4@triage"}) {
		t.Fatalf("sweep: %s, published %v; want RHEL-4 only", s, h.published())
	}
	for _, k := range []string{"RHEL-1", "RHEL-2", "RHEL-3"} {
		if w := h.writes(k); len(w) != 0 {
			t.Errorf("%s: label writes %v, want none", k, w)
		}
	}
}
