package fetcher

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/jira/fakejira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// getIssue reads an issue from the fake as a webhook's payload would carry it.
func (h *harness) getIssue(key string) jira.Issue {
	h.t.Helper()
	is, err := h.jc.GetIssue(h.ctx, key, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return is
}

// Process applies the sweep's rules to issues handed in (a webhook's): the same outcomes,
// streams and label flips as a sweep over the same issues, and a publish that a later
// sweep does not repeat.
func TestProcessIsTheSweepsPath(t *testing.T) {
	t.Parallel()
	issues := []fakejira.Issue{
		iss("RHEL-1"), todoBy(iss("RHEL-2"), member), todoBy(iss("RHEL-3"), outsider),
		iss("RHEL-4", labels.RetryNeeded), component(todoBy(iss("RHEL-5"), member), "perl:5.32/perl"),
		iss("RHEL-6", "ymir_triaged_rebase"),
	}
	h := newHarness(t, issues)
	f := h.fetcher()
	var items []Item
	for _, is := range issues {
		items = append(items, Item{Issue: h.getIssue(is.Key)})
	}
	s, err := f.Process(h.ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.published(); !slices.Equal(got, []string{"RHEL-1@triage", "RHEL-2@todo", "RHEL-4@triage"}) {
		t.Fatalf("published %v (%s)", got, s)
	}
	for key, want := range map[string]Reason{"RHEL-3": ReasonUntrusted, "RHEL-5": ReasonModular, "RHEL-6": ReasonLabelled} {
		if o, _ := s.Outcome(key); o.Reason != want {
			t.Errorf("%s: outcome %+v, want %s", key, o, want)
		}
	}
	wantLabels("RHEL-2", labels.TriageInProgress)(t, h, s)
	wantLabels("RHEL-3")(t, h, s)
	// The same batch again: nothing more is published. A sweep then publishes only
	// RHEL-3, fresh now that its untrusted ymir_todo is gone, as a second sweep would.
	if s, err = f.Process(h.ctx, items...); err != nil || s.Published != 0 {
		t.Fatalf("second Process: %s, %v", s, err)
	}
	if s := h.sweep(); !slices.Equal(s.PublishedKeys(), []string{"RHEL-3"}) || len(h.published()) != 4 {
		t.Fatalf("sweep after Process: %s, streams %v", s, h.published())
	}
}

// A source that knows who added ymir_todo (a webhook's changelog) spares the changelog
// read; the group check still applies to that user.
func TestProcessKnownTodoAdder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, []fakejira.Issue{todoBy(iss("RHEL-1"), outsider), todoBy(iss("RHEL-2"), outsider)})
	f := h.fetcher()
	s, err := f.Process(h.ctx,
		Item{Issue: h.getIssue("RHEL-1"), TodoAddedBy: &jira.User{AccountID: member}},
		Item{Issue: h.getIssue("RHEL-2"), TodoAddedBy: &jira.User{AccountID: outsider}})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.published(); !slices.Equal(got, []string{"RHEL-1@todo"}) {
		t.Fatalf("published %v (%s)", got, s)
	}
	if o, _ := s.Outcome("RHEL-2"); o.Reason != ReasonUntrusted {
		t.Errorf("RHEL-2: %+v", o)
	}
	if n := len(h.changelogReads("")); n != 0 {
		t.Errorf("%d changelog reads, want none", n)
	}
}

// A member of the trigger group, once read from Jira, is trusted for MemberTTL across
// Process calls: a maintainer's next ymir_todo costs no group read before its publish
// (issue 35 item 12). Non-members are read every time, so a user just added to the group
// is not refused; after the TTL, and with a negative one, members are read again.
func TestTriggerGroupMembersRemembered(t *testing.T) {
	t.Parallel()
	var issues []fakejira.Issue
	for i := range 5 {
		issues = append(issues, todoBy(iss("RHEL-"+strconv.Itoa(i+1)), member), todoBy(iss("OUT-"+strconv.Itoa(i+1)), outsider))
	}
	h := newHarness(t, issues)
	f := h.fetcher()
	groupReads := func() int { return len(h.requests(http.MethodGet, "/rest/api/2/user")) } // Server's and Cloud's group reads
	steps := []struct {
		f     *Fetcher
		key   string
		by    string
		want  Reason
		reads int
	}{
		{f, "RHEL-1", member, "", 1},
		{f, "RHEL-2", member, "", 1}, // remembered
		{f, "OUT-1", outsider, ReasonUntrusted, 2},
		{f, "OUT-2", outsider, ReasonUntrusted, 3}, // non-members are not remembered
	}
	run := func(f *Fetcher, key, by string, want Reason) {
		t.Helper()
		s, err := f.Process(h.ctx, Item{Issue: h.getIssue(key), TodoAddedBy: &jira.User{AccountID: by}})
		if err != nil {
			t.Fatal(err)
		}
		if o, _ := s.Outcome(key); o.Reason != want || o.Published != (want == "") {
			t.Fatalf("%s: %+v, want reason %q", key, o, want)
		}
	}
	for _, st := range steps {
		run(st.f, st.key, st.by, st.want)
		if n := groupReads(); n != st.reads {
			t.Fatalf("after %s: %d group reads, want %d", st.key, n, st.reads)
		}
	}
	h.now = h.now.Add(DefaultMemberTTL + time.Second)
	run(f, "RHEL-3", member, "")
	if n := groupReads(); n != 4 {
		t.Fatalf("after the TTL: %d group reads, want 4", n)
	}
	never := h.fetcher(func(c *Config) { c.MemberTTL = -1 })
	run(never, "RHEL-4", member, "")
	run(never, "RHEL-5", member, "")
	if n := groupReads(); n != 6 {
		t.Fatalf("MemberTTL negative: %d group reads, want 6", n)
	}
}
