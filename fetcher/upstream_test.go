package fetcher

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// upCase is one port of a test of the Python fetcher's unit tests
// (ymir/jira_issue_fetcher/tests/unit/test_jira_issue_fetcher.py), named after it. Where this design deliberately differs from upstream
// (publish before flip; a locked issue keeps its trigger), the case asserts the new
// contract and says so.
type upCase struct {
	name   string
	issues []fakejira.Issue
	opts   []harnessOpt
	cfg    func(*Config)
	setup  func(t *testing.T, h *harness)
	// want is every entry in the triage streams after the sweep, "KEY@triage" or "KEY@todo".
	want []string
	// writes are the Jira label writes per issue ("+add -remove"); a key absent from the
	// map must have had none.
	writes map[string][]string
	// skipped are the expected non-zero skip counts.
	skipped map[Reason]int
	wantErr func(error) bool
	check   func(t *testing.T, h *harness, s Summary)
}

func TestUpstreamFetcherCases(t *testing.T) {
	// Not parallel: the cases are its subtests, and they run in parallel.
	stale := 100 * time.Hour
	cases := append(append(upstreamSearchCases(), upstreamQueueCases(stale)...), upstreamWorkflowCases(stale)...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, c.issues, c.opts...)
			if c.setup != nil {
				c.setup(t, h)
			}
			mods := []func(*Config){}
			if c.cfg != nil {
				mods = append(mods, c.cfg)
			}
			s, err := h.fetcher(mods...).Sweep(h.ctx)
			switch {
			case c.wantErr != nil && (err == nil || !c.wantErr(err)):
				t.Fatalf("sweep error %v, not the one wanted", err)
			case c.wantErr == nil && err != nil:
				t.Fatalf("sweep: %v\nlog:\n%s", err, h.logBuf)
			}
			if got := h.published(); !slices.Equal(got, c.want) {
				t.Errorf("streams hold %v, want %v\nsummary: %s", got, c.want, s)
			}
			for _, is := range c.issues {
				key := strings.ToUpper(is.Key)
				if got, want := h.writes(key), c.writes[key]; !slices.Equal(got, want) {
					t.Errorf("%s: Jira label writes %q, want %q", key, got, want)
				}
			}
			for _, r := range summaryReasons {
				if got, want := s.Skipped[r], c.skipped[r]; got != want {
					t.Errorf("skipped %s = %d, want %d (%s)", r, got, want, s)
				}
			}
			if c.check != nil {
				c.check(t, h, s)
			}
			if t.Failed() {
				t.Logf("log:\n%s", h.logBuf)
			}
		})
	}
}

type checkFn = func(t *testing.T, h *harness, s Summary)

func all(fs ...checkFn) checkFn {
	return func(t *testing.T, h *harness, s Summary) {
		for _, f := range fs {
			f(t, h, s)
		}
	}
}

func wantUserTriggered(key string, want bool) checkFn {
	return func(t *testing.T, h *harness, s Summary) {
		for _, q := range h.streamEntries() {
			if q.Key == key && (q.UserTriggered != want || q.Meta[event.MetaUserTriggered] != strings.ToLower(boolStr(want))) {
				t.Errorf("%s: user_triggered %v / %q, want %v", key, q.UserTriggered, q.Meta[event.MetaUserTriggered], want)
			}
		}
	}
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func wantLabels(key string, labels ...string) checkFn {
	return func(t *testing.T, h *harness, s Summary) {
		want := slices.Clone(labels)
		slices.Sort(want)
		if got := h.labels(key); !slices.Equal(got, want) {
			t.Errorf("%s: labels %v, want %v", key, got, want)
		}
	}
}

func wantDryRunOutcome(key string) checkFn {
	return func(t *testing.T, h *harness, s Summary) {
		if !s.DryRun || s.LabelWrites != 0 {
			t.Errorf("DryRun %v, LabelWrites %d", s.DryRun, s.LabelWrites)
		}
		if n := len(h.requests(http.MethodPut, "")); n != 0 {
			t.Errorf("%d Jira writes in dry run", n)
		}
		if o, _ := s.Outcome(key); !o.Published || !slices.Contains(o.Added, labels.TriageInProgress) {
			t.Errorf("outcome %+v: the flip it would make should be recorded", o)
		}
	}
}

func noAuthorCheck(t *testing.T, h *harness, s Summary) {
	if n := len(h.changelogReads("")) + len(h.requests("", "/user")); n != 0 {
		t.Errorf("%d author-check requests", n)
	}
}

// flipFailedOnce checks a publish whose flip failed: the request is out once, the labels
// are as before, and a second sweep does not publish it again.
func flipFailedOnce(key string, labels []string) checkFn {
	return func(t *testing.T, h *harness, s Summary) {
		o, _ := s.Outcome(key)
		if !o.Published || o.FlipErr == nil || s.FlipFailures != 1 {
			t.Errorf("outcome %+v, FlipFailures %d", o, s.FlipFailures)
		}
		wantLabels(key, labels...)(t, h, s)
		before := h.published()
		s2 := h.sweep()
		if got := h.published(); !slices.Equal(got, before) {
			t.Errorf("second sweep published again: %v -> %v", before, got)
		}
		if s2.Skipped[ReasonQueued] != 1 {
			t.Errorf("second sweep: %s", s2)
		}
	}
}

func lockIssue(agent, key string) func(t *testing.T, h *harness) {
	return func(t *testing.T, h *harness) {
		if _, err := h.locker.Acquire(h.ctx, agent, key, lease.AcquireOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// publishedAfterRelease releases the lease (as its holder would) and checks that the next
// sweep publishes the issue and flips its trigger.
func publishedAfterRelease(agent, key, want string, labels ...string) checkFn {
	return func(t *testing.T, h *harness, s Summary) {
		if o, _ := s.Outcome(key); o.Stage != agent {
			t.Errorf("outcome %+v, want locked by %s", o, agent)
		}
		if _, err := h.locker.ForceRelease(h.ctx, agent, key); err != nil {
			t.Fatal(err)
		}
		s2 := h.sweep()
		if got := h.published(); !slices.Equal(got, []string{want}) {
			t.Errorf("after release: %v, want %v (%s)", got, want, s2)
		}
		wantLabels(key, labels...)(t, h, s2)
	}
}

// prePublish puts a triage request for key in a stream as an earlier sweep would have.
func prePublish(t *testing.T, h *harness, key string, todo bool) {
	t.Helper()
	f := h.fetcher()
	msg, err := event.New(event.TriageRequested, key, triageTask(key, todo), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, fresh, err := f.publish(h.ctx, key, h.topo.Stream("triage", "", todo), event.Encode(msg)); err != nil || !fresh {
		t.Fatalf("prePublish %s: %v %v", key, fresh, err)
	}
}

// upstreamSearchCases are the cases of the Jira client and search: authentication, rate
// limit, retries, pages.
func upstreamSearchCases() []upCase {
	var rateLimitFrom time.Time // test_rate_limit: before its sweep's first request
	return []upCase{
		{
			name:   "test_init",
			issues: []fakejira.Issue{iss("RHEL-1")},
			opts: []harnessOpt{
				withFake(func(o *fakejira.Options) { o.Email, o.Token = "bot@example.com", "s3cret" }),
				withJira(func(o *jira.Options) { o.Email, o.Token = "bot@example.com", "s3cret" }),
			},
			want: []string{"RHEL-1@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				for _, r := range h.srv.Requests() {
					if !strings.HasPrefix(r.Authorization, "Basic ") || r.Status == http.StatusUnauthorized {
						t.Errorf("%s %s: Authorization %q, status %d", r.Method, r.Path, r.Authorization, r.Status)
					}
				}
				if h.jc.API() != jira.APIServer {
					t.Errorf("API for a non-atlassian host = %s", h.jc.API())
				}
			},
		},
		{
			name:   "test_rate_limit",
			issues: []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2"), iss("RHEL-3"), iss("RHEL-4"), iss("RHEL-5"), iss("RHEL-6"), iss("RHEL-7")},
			opts: []harnessOpt{
				withFake(func(o *fakejira.Options) { o.MaxPageSize = 1 }),
				withJira(func(o *jira.Options) { o.RateLimit = 0 }), // the default: 5 per second, a burst of 5
			},
			setup: func(t *testing.T, h *harness) { rateLimitFrom = time.Now() },
			want:  []string{"RHEL-1@triage", "RHEL-2@triage", "RHEL-3@triage", "RHEL-4@triage", "RHEL-5@triage", "RHEL-6@triage", "RHEL-7@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				rs := h.requests(http.MethodPost, "/search")
				if len(rs) != 7 {
					t.Fatalf("%d search requests, want 7 pages", len(rs))
				}
				// An idle client sends its burst of 5 at once; request i after it leaves no
				// earlier than i-4 slots of 200ms after the first, which left after
				// rateLimitFrom. Gaps between arrivals prove nothing on a busy machine: a
				// late first arrival shortens the next gap (177ms was seen).
				for i, r := range rs {
					if at, want := r.At.Sub(rateLimitFrom), time.Duration(max(0, i-4))*200*time.Millisecond; at < want {
						t.Errorf("request %d reached Jira %s after the sweep began, want >= %s (5/s after a burst of 5)", i, at, want)
					}
				}
			},
		},
		{
			name:   "test_make_request_with_retries_success",
			issues: []fakejira.Issue{iss("RHEL-1")},
			setup:  func(t *testing.T, h *harness) { h.srv.FailNext(1, http.StatusBadGateway, "") },
			want:   []string{"RHEL-1@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				if n := len(h.requests(http.MethodPost, "/rest/api/2/search")); n != 2 {
					t.Errorf("%d search POSTs, want 2 (a 502, then the retry)", n)
				}
			},
		},
		{
			name:    "test_make_request_with_retries_rate_limited",
			issues:  []fakejira.Issue{iss("RHEL-1")},
			setup:   func(t *testing.T, h *harness) { h.srv.FailNext(100, http.StatusTooManyRequests, "") },
			wantErr: func(err error) bool { return errors.Is(err, jira.ErrRateLimited) && !Fatal(err) },
			check: func(t *testing.T, h *harness, s Summary) {
				if n := len(h.requests(http.MethodPost, "/search")); n != 3 {
					t.Errorf("%d search POSTs, want 3 (MaxRetries 2 + 1)", n)
				}
			},
		},
		{
			name:   "test_search_issues_single_page",
			issues: []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2")},
			opts:   []harnessOpt{withAPI(jira.APICloud), withJira(func(o *jira.Options) { o.Email = "bot@example.com" })},
			want:   []string{"RHEL-1@triage", "RHEL-2@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				rs := h.requests(http.MethodPost, "/rest/api/3/search/jql")
				if len(rs) != 1 {
					t.Fatalf("%d search requests", len(rs))
				}
				var body map[string]any
				if err := json.Unmarshal(rs[0].Body, &body); err != nil {
					t.Fatal(err)
				}
				want := map[string]any{"jql": "project = RHEL", "maxResults": float64(jira.DefaultPageSize),
					"fields": []any{"labels", "updated", "status", "components", "fixVersions", DefaultComponentField}}
				if mustJSON(t, body) != mustJSON(t, want) {
					t.Errorf("search body %s, want %s", body, mustJSON(t, want))
				}
			},
		},
		{
			name:   "test_search_issues_multiple_pages/cloud",
			issues: []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2"), iss("RHEL-3"), iss("RHEL-4"), iss("RHEL-5")},
			opts: []harnessOpt{withAPI(jira.APICloud), withJira(func(o *jira.Options) { o.Email = "b@x" }),
				withFake(func(o *fakejira.Options) { o.MaxPageSize = 2 })},
			want: []string{"RHEL-1@triage", "RHEL-2@triage", "RHEL-3@triage", "RHEL-4@triage", "RHEL-5@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				rs := h.requests(http.MethodPost, "/rest/api/3/search/jql")
				if len(rs) != 3 {
					t.Fatalf("%d pages, want 3", len(rs))
				}
				for i, r := range rs {
					has := strings.Contains(string(r.Body), `"nextPageToken"`)
					if has != (i > 0) {
						t.Errorf("page %d body %s: nextPageToken present=%v", i+1, r.Body, has)
					}
				}
			},
		},
		{
			name:   "test_search_issues_multiple_pages/server",
			issues: []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2"), iss("RHEL-3"), iss("RHEL-4"), iss("RHEL-5")},
			opts:   []harnessOpt{withAPI(jira.APIServer), withFake(func(o *fakejira.Options) { o.MaxPageSize = 2 })},
			want:   []string{"RHEL-1@triage", "RHEL-2@triage", "RHEL-3@triage", "RHEL-4@triage", "RHEL-5@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				rs := h.requests(http.MethodPost, "/rest/api/2/search")
				if len(rs) != 3 {
					t.Fatalf("%d pages, want 3", len(rs))
				}
				for i, r := range rs {
					var b struct{ StartAt int }
					_ = json.Unmarshal(r.Body, &b)
					if b.StartAt != 2*i {
						t.Errorf("page %d startAt %d", i+1, b.StartAt)
					}
				}
			},
		},
		{
			name:   "test_get_existing_issue_keys",
			issues: []fakejira.Issue{iss("RHEL-1"), todoBy(iss("RHEL-2"), member), iss("RHEL-3")},
			setup: func(t *testing.T, h *harness) {
				prePublish(t, h, "RHEL-1", false)
				prePublish(t, h, "RHEL-2", true)
			},
			want:    []string{"RHEL-1@triage", "RHEL-2@todo", "RHEL-3@triage"},
			skipped: map[Reason]int{ReasonQueued: 2},
			check: func(t *testing.T, h *harness, s Summary) {
				if got := h.labels("RHEL-2"); !slices.Equal(got, []string{labels.Todo}) {
					t.Errorf("RHEL-2 labels %v: a queued issue's trigger must stay", got)
				}
				if len(h.changelogReads("")) != 0 {
					t.Error("author check made for a queued issue")
				}
			},
		},
	}
}

// upstreamQueueCases are the cases of the publish: existing keys, skips, bounds, retries,
// dry run; issues updated stale ago are stale.
func upstreamQueueCases(stale time.Duration) []upCase {
	return []upCase{
		{
			// No reproducer stage here; the downstream streams play that part: a stale
			// ymir_triaged_backport whose backport request still waits is not re-triaged.
			name:   "test_get_existing_issue_keys_includes_reproducer_queues",
			issues: []fakejira.Issue{updated(iss("RHEL-1", "ymir_triaged_backport"), stale), updated(iss("RHEL-2", "ymir_triaged_backport"), stale)},
			setup: func(t *testing.T, h *harness) {
				s := h.topo.Stream("backport", "c9s", false)
				id := h.rdb.XAdd(h.ctx, &redis.XAddArgs{Stream: s, Values: map[string]any{"payload": "{}"}}).Val()
				h.rdb.Set(h.ctx, h.topo.Queued("backport", "RHEL-1"), id+" "+s, time.Hour)
			},
			want:    []string{"RHEL-2@triage"},
			skipped: map[Reason]int{ReasonQueued: 1},
			writes: map[string][]string{"RHEL-2": {"+ymir_retry_needed -ymir_triaged_backport",
				"+ymir_triage_in_progress -ymir_retry_needed"}},
		},
		{
			name:   "test_push_issues_to_queue",
			issues: []fakejira.Issue{iss("RHEL-1")},
			want:   []string{"RHEL-1@triage"},
			check: func(t *testing.T, h *harness, s Summary) {
				if s.Published != 1 {
					t.Errorf("Published = %d", s.Published)
				}
				q := h.streamEntries()[0]
				var got, want any
				_ = json.Unmarshal([]byte(q.Payload), &got)
				_ = json.Unmarshal([]byte(`{"metadata":{"issue":"RHEL-1","force_cve_triage":false,"is_older_zstream":false,"needs_internal_fix":false,"internal_target_branch":null},"attempts":0,"user_triggered":false}`), &want)
				if mustJSON(t, got) != mustJSON(t, want) {
					t.Errorf("payload %s\nwant Task.from_issue %s", mustJSON(t, got), mustJSON(t, want))
				}
				for k, v := range map[string]string{event.MetaEventType: event.TriageRequested, event.MetaIssueKey: "RHEL-1",
					event.MetaSchemaVersion: event.SchemaVersion, event.MetaUserTriggered: "false", event.MetaAttempt: "0"} {
					if q.Meta[k] != v {
						t.Errorf("metadata %s = %q, want %q", k, q.Meta[k], v)
					}
				}
				if q.Meta[event.MetaCorrelationID] == "" {
					t.Error("no correlation_id")
				}
				if o, _ := s.Outcome("RHEL-1"); o.EntryID != q.ID || o.Trigger != TriggerFresh {
					t.Errorf("outcome %+v, entry %s", o, q.ID)
				}
			},
		},
		{
			name:    "test_push_issues_to_queue_skip_existing",
			issues:  []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2")},
			setup:   func(t *testing.T, h *harness) { prePublish(t, h, "RHEL-1", false) },
			want:    []string{"RHEL-1@triage", "RHEL-2@triage"},
			skipped: map[Reason]int{ReasonQueued: 1},
			check: func(t *testing.T, h *harness, s Summary) {
				if got := s.PublishedKeys(); !slices.Equal(got, []string{"RHEL-2"}) {
					t.Errorf("published %v", got)
				}
			},
		},
		{
			name:    "test_push_issues_to_queue_skip_labeled_issues",
			issues:  []fakejira.Issue{iss("RHEL-1", "ymir_triaged_rebase"), iss("RHEL-2", labels.RetryNeeded), iss("RHEL-3")},
			want:    []string{"RHEL-2@triage", "RHEL-3@triage"},
			writes:  map[string][]string{"RHEL-2": {"+ymir_triage_in_progress -ymir_retry_needed"}},
			skipped: map[Reason]int{ReasonLabelled: 1},
		},
		{
			name: "test_push_issues_to_queue_skip_modular",
			issues: []fakejira.Issue{component(iss("RHEL-1"), "perl:5.32/perl"), component(iss("RHEL-2"), "nodejs:18/nodejs"),
				component(iss("RHEL-3"), "openssl"), component(iss("RHEL-4"), nil),
				{Key: "RHEL-5", Components: []string{"ruby:3.1/ruby"}, Updated: time.Now()}},
			want:    []string{"RHEL-3@triage", "RHEL-4@triage"},
			skipped: map[Reason]int{ReasonModular: 3},
		},
		// test_push_issues_to_queue_skip_ignored_components passes vacuously upstream
		// (component filtering was removed in 0f9176d); there is nothing to port.
		{
			name:    "test_push_issues_to_queue_max_issues",
			issues:  []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2"), iss("RHEL-3")},
			cfg:     func(c *Config) { c.MaxIssues = 2 },
			want:    []string{"RHEL-1@triage", "RHEL-2@triage"},
			skipped: map[Reason]int{ReasonMaxIssues: 1},
		},
		{
			name: "test_push_issues_to_queue_max_issues_excludes_filtered",
			issues: []fakejira.Issue{component(iss("RHEL-1"), "perl:5.32/perl"), iss("RHEL-2"), component(iss("RHEL-3"), "nodejs:18/nodejs"),
				iss("RHEL-4", "ymir_triaged"), iss("RHEL-5"), iss("RHEL-6")},
			cfg:     func(c *Config) { c.MaxIssues = 2 },
			want:    []string{"RHEL-2@triage", "RHEL-5@triage"},
			skipped: map[Reason]int{ReasonModular: 2, ReasonLabelled: 1, ReasonMaxIssues: 1},
		},
		{
			name:   "test_push_retry_needed_issue",
			issues: []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded)},
			want:   []string{"RHEL-1@triage"},
			writes: map[string][]string{"RHEL-1": {"+ymir_triage_in_progress -ymir_retry_needed"}},
			check:  wantUserTriggered("RHEL-1", false),
		},
		{
			name:    "test_skip_retry_needed_when_in_progress",
			issues:  []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded, labels.TriageInProgress)},
			skipped: map[Reason]int{ReasonLabelled: 1},
		},
		{
			// Publish comes first here: a failing flip leaves the request out and the
			// trigger in place; the queued marker keeps the next sweep from a second publish.
			name:   "test_retry_needed_skip_when_label_flip_fails",
			issues: []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded)},
			setup:  func(t *testing.T, h *harness) { h.failPut["RHEL-1"] = http.StatusInternalServerError },
			want:   []string{"RHEL-1@triage"},
			check:  flipFailedOnce("RHEL-1", []string{labels.RetryNeeded}),
		},
		{
			name:   "test_dry_run_skips_flip_but_still_pushes/todo",
			issues: []fakejira.Issue{todoBy(iss("RHEL-1"), member)},
			cfg:    func(c *Config) { c.DryRun = true },
			want:   []string{"RHEL-1@todo"},
			check:  all(wantUserTriggered("RHEL-1", true), wantLabels("RHEL-1", labels.Todo), wantDryRunOutcome("RHEL-1")),
		},
		{
			name:   "test_dry_run_skips_flip_but_still_pushes/retry",
			issues: []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded)},
			cfg:    func(c *Config) { c.DryRun = true },
			want:   []string{"RHEL-1@triage"},
			check:  all(wantUserTriggered("RHEL-1", false), wantLabels("RHEL-1", labels.RetryNeeded), wantDryRunOutcome("RHEL-1")),
		},
	}
}

// upstreamWorkflowCases are the cases of whole sweeps and of stale in-flight labels
// (issues updated stale ago).
func upstreamWorkflowCases(stale time.Duration) []upCase {
	return []upCase{
		{
			name:    "test_run_full_workflow",
			issues:  []fakejira.Issue{iss("RHEL-1"), iss("RHEL-2", "ymir_triaged")},
			want:    []string{"RHEL-1@triage"},
			skipped: map[Reason]int{ReasonLabelled: 1},
			check: func(t *testing.T, h *harness, s Summary) {
				if n := len(h.requests("", "/search")); n != 1 {
					t.Errorf("%d searches, want 1", n)
				}
				if s.Found != 2 || s.Published != 1 || s.Skipped[ReasonLabelled] != 1 {
					t.Errorf("summary %s", s)
				}
			},
		},
		{
			// Upstream's never-shrinking lists have no equivalent: an entry that was acked
			// no longer counts, so ymir_retry_needed on an issue processed before is
			// published; one still waiting is not.
			name: "test_run_full_workflow_with_labeled_issues",
			issues: []fakejira.Issue{iss("RHEL-1", "ymir_triage_in_progress"), iss("RHEL-2", "ymir_completed"),
				iss("RHEL-3"), iss("RHEL-4", labels.RetryNeeded), iss("RHEL-5", "ymir_reproducer_in_progress")},
			setup: func(t *testing.T, h *harness) {
				prePublish(t, h, "RHEL-4", false)
				h.consume() // RHEL-4's earlier request was handled
				prePublish(t, h, "RHEL-3", false)
			},
			want:    []string{"RHEL-3@triage", "RHEL-4@triage", "RHEL-4@triage"},
			writes:  map[string][]string{"RHEL-4": {"+ymir_triage_in_progress -ymir_retry_needed"}},
			skipped: map[Reason]int{ReasonLabelled: 3, ReasonQueued: 1},
			check: func(t *testing.T, h *harness, s Summary) {
				if s.Published != 1 {
					t.Errorf("published %v, want exactly RHEL-4", s.PublishedKeys())
				}
			},
		},
		{
			name:   "test_push_routes_to_priority_queue_for_user_triggered/none",
			issues: []fakejira.Issue{iss("RHEL-1")},
			want:   []string{"RHEL-1@triage"},
			check:  wantUserTriggered("RHEL-1", false),
		},
		{
			name:   "test_push_routes_to_priority_queue_for_user_triggered/todo",
			issues: []fakejira.Issue{todoBy(iss("RHEL-1"), member)},
			want:   []string{"RHEL-1@todo"},
			writes: map[string][]string{"RHEL-1": {"+ymir_triage_in_progress -ymir_todo"}},
			check:  wantUserTriggered("RHEL-1", true),
		},
		{
			name:   "test_push_routes_to_priority_queue_for_user_triggered/retry",
			issues: []fakejira.Issue{iss("RHEL-1", labels.RetryNeeded)},
			want:   []string{"RHEL-1@triage"},
			writes: map[string][]string{"RHEL-1": {"+ymir_triage_in_progress -ymir_retry_needed"}},
			check:  wantUserTriggered("RHEL-1", false),
		},
		{
			// Upstream flips, then pushes; here the publish comes first, then the flip.
			name:   "test_push_user_triggered_issue",
			issues: []fakejira.Issue{todoBy(iss("RHEL-1"), member)},
			want:   []string{"RHEL-1@todo"},
			writes: map[string][]string{"RHEL-1": {"+ymir_triage_in_progress -ymir_todo"}},
			check: all(wantUserTriggered("RHEL-1", true), wantLabels("RHEL-1", labels.TriageInProgress),
				func(t *testing.T, h *harness, s Summary) {
					if len(h.changelogReads("RHEL-1")) == 0 {
						t.Error("no author check")
					}
					put := h.requests(http.MethodPut, "/issue/RHEL-1")
					entryMS := mustID(h.streamEntries()[0].ID).MS
					if len(put) != 1 || uint64(put[0].At.UnixMilli()) < entryMS {
						t.Errorf("flip at %v, entry at %d ms: the publish must come first", put, entryMS)
					}
				}),
		},
		{
			name:    "test_skip_user_triggered_when_in_progress",
			issues:  []fakejira.Issue{todoBy(iss("RHEL-1", labels.TriageInProgress), member)},
			skipped: map[Reason]int{ReasonLabelled: 1},
			check:   noAuthorCheck,
		},
		{
			name:    "test_skip_user_triggered_when_not_rh_employee",
			issues:  []fakejira.Issue{todoBy(iss("RHEL-1"), outsider)},
			writes:  map[string][]string{"RHEL-1": {"-ymir_todo"}},
			skipped: map[Reason]int{ReasonUntrusted: 1},
			check:   wantLabels("RHEL-1"),
		},
		{
			name:   "test_user_triggered_skip_when_label_flip_fails",
			issues: []fakejira.Issue{todoBy(iss("RHEL-1"), member)},
			setup:  func(t *testing.T, h *harness) { h.failPut["RHEL-1"] = http.StatusBadRequest },
			want:   []string{"RHEL-1@todo"},
			check:  flipFailedOnce("RHEL-1", []string{labels.Todo}),
		},
		{
			name:   "test_label_added_by_rh_employee_true",
			issues: []fakejira.Issue{todoBy(iss("RHEL-1"), member)},
			want:   []string{"RHEL-1@todo"},
			writes: map[string][]string{"RHEL-1": {"+ymir_triage_in_progress -ymir_todo"}},
		},
		{
			name:    "test_label_added_by_rh_employee_false_when_author_not_in_group",
			issues:  []fakejira.Issue{todoBy(iss("RHEL-1"), outsider)},
			writes:  map[string][]string{"RHEL-1": {"-ymir_todo"}},
			skipped: map[Reason]int{ReasonUntrusted: 1},
		},
		{
			name:    "test_label_added_by_rh_employee_picks_latest_add",
			issues:  []fakejira.Issue{todoBy(iss("RHEL-1"), member, outsider)},
			writes:  map[string][]string{"RHEL-1": {"-ymir_todo"}},
			skipped: map[Reason]int{ReasonUntrusted: 1},
		},
		{
			name:    "test_label_added_by_rh_employee_false_when_no_add_event",
			issues:  []fakejira.Issue{iss("RHEL-1", labels.Todo)},
			writes:  map[string][]string{"RHEL-1": {"-ymir_todo"}},
			skipped: map[Reason]int{ReasonUntrusted: 1},
			check: func(t *testing.T, h *harness, s Summary) {
				if n := len(h.requests("", "/user")); n != 0 {
					t.Errorf("%d user lookups without an add event", n)
				}
			},
		},
		{
			name: "test_label_added_by_rh_employee_walks_paginated_changelog",
			issues: []fakejira.Issue{func() fakejira.Issue {
				is := iss("RHEL-1")
				for i := 0; i < 3; i++ { // page 1 holds only unrelated changes
					is.Changelog = append(is.Changelog, jira.ChangelogEntry{ID: "x" + string(rune('0'+i)), Author: jira.User{AccountID: outsider},
						Created: jira.Time{Time: time.Now().Add(-3 * time.Hour)}, Items: []jira.ChangeItem{{Field: "status", FromString: "New", ToString: "Planning"}}})
				}
				return todoBy(is, member)
			}()},
			opts:   []harnessOpt{withAPI(jira.APICloud), withJira(func(o *jira.Options) { o.Email = "b@x"; o.PageSize = 3 })},
			want:   []string{"RHEL-1@todo"},
			writes: map[string][]string{"RHEL-1": {"+ymir_triage_in_progress -ymir_todo"}},
			check: func(t *testing.T, h *harness, s Summary) {
				if n := len(h.changelogReads("RHEL-1")); n != 2 {
					t.Errorf("%d changelog pages read, want 2", n)
				}
			},
		},
		{
			name:   "test_push_stale_triage_in_progress_reenqueued",
			issues: []fakejira.Issue{updated(iss("RHEL-1", labels.TriageInProgress), stale)},
			want:   []string{"RHEL-1@triage"},
			writes: map[string][]string{"RHEL-1": {"+ymir_retry_needed -ymir_triage_in_progress", "+ymir_triage_in_progress -ymir_retry_needed"}},
			check:  all(wantUserTriggered("RHEL-1", false), wantLabels("RHEL-1", labels.TriageInProgress)),
		},
		{
			name:   "test_push_stale_reproducer_in_progress_with_triage_labels_reenqueued",
			issues: []fakejira.Issue{updated(iss("RHEL-1", "ymir_reproducer_in_progress", "ymir_triaged_not_affected", "ymir_cli_triage"), stale)},
			want:   []string{"RHEL-1@triage"},
			writes: map[string][]string{"RHEL-1": {"+ymir_retry_needed -ymir_reproducer_in_progress", "+ymir_triage_in_progress -ymir_retry_needed"}},
			check:  wantLabels("RHEL-1", "ymir_cli_triage", labels.TriageInProgress, "ymir_triaged_not_affected"),
		},
		{
			name:   "test_push_stale_triaged_backport_reenqueued",
			issues: []fakejira.Issue{updated(iss("RHEL-1", "ymir_triaged_backport"), stale)},
			want:   []string{"RHEL-1@triage"},
			writes: map[string][]string{"RHEL-1": {"+ymir_retry_needed -ymir_triaged_backport", "+ymir_triage_in_progress -ymir_retry_needed"}},
			check:  wantLabels("RHEL-1", labels.TriageInProgress),
		},
		{
			name:    "test_push_stale_label_skipped_when_still_queued_in_redis",
			issues:  []fakejira.Issue{updated(iss("RHEL-1", labels.TriageInProgress), stale)},
			setup:   func(t *testing.T, h *harness) { prePublish(t, h, "RHEL-1", false) },
			want:    []string{"RHEL-1@triage"},
			skipped: map[Reason]int{ReasonQueued: 1},
		},
		{
			name:    "test_push_fresh_triage_in_progress_still_skipped",
			issues:  []fakejira.Issue{updated(iss("RHEL-1", labels.TriageInProgress), time.Hour)},
			skipped: map[Reason]int{ReasonLabelled: 1},
		},
		{
			name:    "test_push_stale_in_progress_with_terminal_label_still_skipped",
			issues:  []fakejira.Issue{updated(iss("RHEL-1", "ymir_triaged_rebase", "ymir_rebased"), stale)},
			skipped: map[Reason]int{ReasonLabelled: 1},
		},
		{
			name:   "test_push_stale_reenqueue_skips_when_flip_fails",
			issues: []fakejira.Issue{updated(iss("RHEL-1", "ymir_triaged_backport"), stale)},
			setup:  func(t *testing.T, h *harness) { h.failPut["RHEL-1"] = http.StatusForbidden },
			want:   []string{"RHEL-1@triage"},
			check:  flipFailedOnce("RHEL-1", []string{"ymir_triaged_backport"}),
		},
		{
			name:   "test_push_stale_reenqueue_dry_run_skips_flip_but_still_pushes",
			issues: []fakejira.Issue{updated(iss("RHEL-1", labels.TriageInProgress), stale)},
			cfg:    func(c *Config) { c.DryRun = true },
			want:   []string{"RHEL-1@triage"},
			check:  all(wantLabels("RHEL-1", labels.TriageInProgress), wantDryRunOutcome("RHEL-1")),
		},
		{
			// Changed on purpose (review finding "locked skip strands trigger labels"; the
			// Python fetcher flipped and dropped): a locked issue keeps its trigger and nothing is
			// published; the first sweep after the release consumes it.
			name:    "test_locked_todo_consumes_label_but_skips_enqueue",
			issues:  []fakejira.Issue{todoBy(iss("TODO-1"), member)},
			setup:   lockIssue("triage", "TODO-1"),
			skipped: map[Reason]int{ReasonLocked: 1},
			check:   all(noAuthorCheck, wantLabels("TODO-1", labels.Todo), publishedAfterRelease("triage", "TODO-1", "TODO-1@todo", labels.TriageInProgress)),
		},
		{
			name:    "test_locked_retry_needed_consumes_label_but_skips_enqueue",
			issues:  []fakejira.Issue{iss("RETRY-1", labels.RetryNeeded)},
			setup:   lockIssue("triage", "RETRY-1"),
			skipped: map[Reason]int{ReasonLocked: 1},
			check:   all(wantLabels("RETRY-1", labels.RetryNeeded), publishedAfterRelease("triage", "RETRY-1", "RETRY-1@triage", labels.TriageInProgress)),
		},
	}
}
