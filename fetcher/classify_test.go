package fetcher

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// Ports of upstream's test_is_label_stale [5 cases] and
// test_is_label_stale_naive_datetime_treated_as_utc (threshold 24 h).
func TestIsLabelStale(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	jiraFmt := func(d time.Duration) string { return now.Add(-d).Format("2006-01-02T15:04:05.000-0700") }
	cases := []struct {
		name, updated string
		want          bool
	}{
		{"test_is_label_stale/100h_ago", jiraFmt(100 * time.Hour), true},
		{"test_is_label_stale/now", jiraFmt(0), false},
		{"test_is_label_stale/jira_format_no_colon_offset", "2020-01-01T00:00:00.000+0000", true},
		{"test_is_label_stale/missing", "", false},
		{"test_is_label_stale/garbage", "not-a-date", false},
		{"test_is_label_stale_naive_datetime_treated_as_utc", "2020-01-01T00:00:00.000", true},
		// Not upstream: offsets other than +0000, RFC 3339, and a naive time just inside.
		{"offset_-0500_23h_ago", now.Add(-23 * time.Hour).In(time.FixedZone("EST", -5*3600)).Format("2006-01-02T15:04:05.000-0700"), false},
		{"rfc3339_25h_ago", now.Add(-25 * time.Hour).Format(time.RFC3339), true},
		{"naive_23h_ago_is_utc", now.Add(-23 * time.Hour).Format("2006-01-02T15:04:05.000"), false},
		{"naive_25h_ago_is_utc", now.Add(-25 * time.Hour).Format("2006-01-02T15:04:05"), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := isStaleRaw(c.updated, now, 24*time.Hour); got != c.want {
				t.Errorf("isStaleRaw(%q) = %v, want %v", c.updated, got, c.want)
			}
			// The same through the issue JSON decoding the sweep uses.
			if c.name == "test_is_label_stale/garbage" {
				return
			}
			var is jira.Issue
			raw := `{"key":"RHEL-1","fields":{"labels":[],"updated":` + mustJSON(t, c.updated) + `}}`
			if err := json.Unmarshal([]byte(raw), &is); err != nil {
				t.Fatal(err)
			}
			if got := isStale(is.Fields.Updated.Time, now, 24*time.Hour); got != c.want {
				t.Errorf("isStale(decoded %q) = %v, want %v", c.updated, got, c.want)
			}
		})
	}
}

// Ports of upstream's test_find_stale_in_flight_label_* and test_find_stale_reproducer_*.
func TestFindStaleInFlightLabel(t *testing.T) {
	t.Parallel()
	now := time.Now()
	stale, fresh := now.Add(-100*time.Hour), now.Add(-time.Minute)
	cases := []struct {
		name    string
		labels  []string
		updated time.Time
		want    string
	}{
		{"test_find_stale_in_flight_label_returns_label_when_alone_and_stale", []string{"ymir_triage_in_progress"}, stale, "ymir_triage_in_progress"},
		{"test_find_stale_in_flight_label_none_when_fresh", []string{"ymir_triage_in_progress"}, fresh, ""},
		{"test_find_stale_in_flight_label_none_when_no_in_flight_label", []string{"ymir_retry_needed"}, stale, ""},
		{"test_find_stale_in_flight_label_none_when_terminal_label_coexists", []string{"ymir_triaged_backport", "ymir_backported"}, stale, ""},
		{"test_find_stale_in_flight_label_ignores_retry_needed_and_todo", []string{"ymir_triage_in_progress", "ymir_retry_needed", "ymir_todo", "sustaining-ok"}, stale, "ymir_triage_in_progress"},
		{"test_find_stale_in_flight_label_downstream_stage", []string{"ymir_triaged_rebuild"}, stale, "ymir_triaged_rebuild"},
		{"test_find_stale_reproducer_in_progress_despite_triage_labels", []string{"ymir_triaged_not_affected", "ymir_cli_triage", "ymir_reproducer_in_progress"}, stale, "ymir_reproducer_in_progress"},
		{"test_find_stale_reproducer_in_progress_blocked_by_terminal_reproducer", []string{"ymir_reproducer_in_progress", "ymir_reproducer_created"}, stale, ""},
		{"test_find_stale_reproducer_in_progress_alone", []string{"ymir_reproducer_in_progress"}, stale, "ymir_reproducer_in_progress"},
		{"test_find_stale_reproducer_in_progress_fresh_not_recovered", []string{"ymir_reproducer_in_progress"}, fresh, ""},
		{"missing_updated_is_not_stale", []string{"ymir_triage_in_progress"}, time.Time{}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := findStaleInFlightLabel(c.labels, c.updated, now, 24*time.Hour); got != c.want {
				t.Errorf("findStaleInFlightLabel(%v) = %q, want %q", c.labels, got, c.want)
			}
		})
	}
}

// TestClassify covers rules A–D and the modular skip without I/O.
func TestClassify(t *testing.T) {
	t.Parallel()
	now := time.Now()
	mk := func(updated time.Time, comp any, labels ...string) jira.Issue {
		f := map[string]any{"labels": labels, "updated": jira.Time{Time: updated}}
		if comp != nil {
			f[DefaultComponentField] = comp
		}
		var is jira.Issue
		if err := json.Unmarshal([]byte(`{"key":"RHEL-1","fields":`+mustJSON(t, f)+`}`), &is); err != nil {
			t.Fatal(err)
		}
		return is
	}
	fresh, stale := now.Add(-time.Hour), now.Add(-48*time.Hour)
	cases := []struct {
		name    string
		is      jira.Issue
		trigger Trigger
		skip    Reason
	}{
		{"fresh", mk(fresh, nil), TriggerFresh, ""},
		{"non-ymir labels only", mk(fresh, nil, "security", "CVE"), TriggerFresh, ""},
		{"A todo", mk(fresh, nil, labels.Todo), TriggerTodo, ""},
		{"A todo with an outcome label (in progress means the _in_progress suffix only)", mk(fresh, nil, labels.Todo, "ymir_triaged_backport"), TriggerTodo, ""},
		{"A todo in progress", mk(fresh, nil, labels.Todo, labels.TriageInProgress), triggerNone, ReasonLabelled},
		{"B stale in progress with todo", mk(stale, nil, labels.Todo, labels.TriageInProgress), TriggerStale, ""},
		{"B stale triaged", mk(stale, nil, "ymir_triaged_rebase"), TriggerStale, ""},
		{"C outcome", mk(stale, nil, "ymir_triaged_not_affected"), triggerNone, ReasonLabelled},
		{"D retry", mk(fresh, nil, labels.RetryNeeded), TriggerRetry, ""},
		{"D retry with an outcome label", mk(fresh, nil, labels.RetryNeeded, "ymir_rebase_errored"), TriggerRetry, ""},
		{"D retry in progress", mk(fresh, nil, labels.RetryNeeded, labels.TriageInProgress), triggerNone, ReasonLabelled},
		{"modular fresh", mk(fresh, "perl:5.32/perl"), triggerNone, ReasonModular},
		{"modular todo is consumed", mk(fresh, "perl:5.32/perl", labels.Todo), triggerTodoM, ""},
		{"modular component object", mk(fresh, map[string]any{"value": "nodejs:18/nodejs"}), triggerNone, ReasonModular},
		{"modular component list", mk(fresh, []any{"nodejs:18/nodejs"}, labels.RetryNeeded), triggerNone, ReasonModular},
		{"modular but labelled counts as labelled", mk(fresh, "perl:5.32/perl", "ymir_triaged"), triggerNone, ReasonLabelled},
		{"not modular: no slash", mk(fresh, "perl:5.32"), TriggerFresh, ""},
		// Parked for its budget: no trigger re-runs it; only an approval resumes it.
		{"parked with retry", mk(fresh, nil, labels.BudgetExhausted, labels.RetryNeeded), triggerNone, ReasonLabelled},
		{"parked with todo", mk(fresh, nil, labels.BudgetExhausted, labels.Todo), triggerNone, ReasonLabelled},
		{"parked stale reproducer", mk(stale, nil, labels.BudgetExhausted, labels.ReproducerInProgress), triggerNone, ReasonLabelled},
		{"parked stale in progress", mk(stale, nil, labels.BudgetExhausted, labels.TriageInProgress, labels.RetryNeeded), triggerNone, ReasonLabelled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := classify(c.is, now, 24*time.Hour, DefaultComponentField)
			if d.trigger != c.trigger || d.skip != c.skip {
				t.Errorf("classify = %+v, want trigger %q skip %q", d, c.trigger, c.skip)
			}
		})
	}
}
