package fakejira

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
)

// Sample users: SampleMaintainer is in SampleTriggerGroup (its ymir_todo is honoured),
// SampleOutsider is not (its ymir_todo is removed by the fetcher).
var (
	SampleMaintainer = jira.User{AccountID: "sample-maintainer", Name: "sample-maintainer", DisplayName: "Sam Maintainer"}
	SampleOutsider   = jira.User{AccountID: "sample-outsider", Name: "sample-outsider", DisplayName: "Olly Outsider"}
)

// SampleTriggerGroup is the group SampleMaintainer belongs to (the fetcher's default
// JIRA_TRIGGER_GROUP).
const SampleTriggerGroup = "Red Hat Employee"

// SampleComponentField is the custom field that names the downstream component; a value
// like "perl:5.32/perl" marks a modular package.
const SampleComponentField = "customfield_10669"

// SampleKind is what a sample issue exercises in the fetcher.
type SampleKind string

// Sample kinds, in the order SampleIssues cycles through them first.
const (
	SampleFresh          SampleKind = "fresh"             // no ymir_* label: published as is
	SampleTodo           SampleKind = "todo"              // ymir_todo added by a maintainer: user-triggered run
	SampleTodoOutsider   SampleKind = "todo-outsider"     // ymir_todo added by an outsider: label removed
	SampleRetry          SampleKind = "retry"             // ymir_retry_needed: re-triaged
	SampleStaleInFlight  SampleKind = "stale-in-progress" // ymir_triage_in_progress, not updated for 3 days: recovered
	SampleStaleTriaged   SampleKind = "stale-triaged"     // ymir_triaged_backport, not updated for 3 days: recovered
	SampleFreshInFlight  SampleKind = "fresh-in-progress" // ymir_triage_in_progress updated an hour ago: left alone
	SampleModular        SampleKind = "modular"           // modular component: skipped
	SampleModularTodo    SampleKind = "modular-todo"      // modular with ymir_todo: the label is consumed
	SampleTriaged        SampleKind = "triaged"           // a triage outcome label: left alone
	SampleDone           SampleKind = "done"              // a terminal downstream label: left alone
	SampleTodoInProgress SampleKind = "todo-in-progress"  // ymir_todo while in progress: left for later
	SampleRetryInFlight  SampleKind = "retry-in-progress" // ymir_retry_needed while in progress: left alone
)

const (
	sampleStaleAge          = 72 * time.Hour     // older than the default 24 h threshold
	sampleFreshAge          = time.Hour          // younger than it
	sampleProject           = "RHEL"             // key prefix
	sampleFirstNumber       = 1001               // first issue number
	sampleModularComponent  = "perl:5.32/perl"   // matches .+:.+/.+
	sampleModularComponent2 = "nodejs:18/nodejs" // idem
	sampleTriageInProgress  = "ymir_triage_in_progress"
)

// SampleKinds lists every kind, in the order SampleIssues cycles through them first.
var SampleKinds = []SampleKind{
	SampleFresh, SampleTodo, SampleTodoOutsider, SampleRetry, SampleStaleInFlight, SampleStaleTriaged,
	SampleFreshInFlight, SampleModular, SampleModularTodo, SampleTriaged, SampleDone,
	SampleTodoInProgress, SampleRetryInFlight,
}

var samplePackages = []string{"openssl", "curl", "glibc", "python3.12", "libxml2", "krb5", "systemd", "nginx", "podman", "expat"}

var sampleTriaged = []string{"ymir_triaged_rebase", "ymir_triaged_not_affected", "ymir_triaged_postponed", "ymir_needs_attention", "ymir_triaged"}

var sampleDone = []string{"ymir_rebased", "ymir_backported", "ymir_rebuilt", "ymir_backport_errored"}

// SampleIssues returns n sample issues (keys RHEL-1001, RHEL-1002, ...) that exercise every
// rule of the fetcher: the first len(SampleKinds) issues take each kind once, in order;
// the rest are drawn at random from seed, about half of them fresh. Timestamps are relative
// to the current time (stale ones are 3 days old). SampleKindOf tells an issue's kind.
// Serve them with SampleGroups so that the ymir_todo adders resolve:
//
//	srv := fakejira.New(fakejira.Options{Issues: fakejira.SampleIssues(20, 1), Groups: fakejira.SampleGroups()})
func SampleIssues(n int, seed int64) []Issue {
	return sampleIssuesAt(n, seed, time.Now())
}

// SampleGroups maps the sample users to their groups.
func SampleGroups() map[string][]string {
	return map[string][]string{
		SampleMaintainer.AccountID: {SampleTriggerGroup, "jira-users"},
		SampleOutsider.AccountID:   {"jira-users"},
	}
}

// SampleKindOf returns the kind of a sample issue (from its Summary), or "".
func SampleKindOf(is Issue) SampleKind {
	for _, k := range SampleKinds {
		if len(is.Summary) > len(k)+2 && is.Summary[:len(k)+2] == "["+string(k)+"]" {
			return k
		}
	}
	return ""
}

func sampleIssuesAt(n int, seed int64, now time.Time) []Issue {
	if n <= 0 {
		return nil
	}
	r := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	now = now.UTC().Truncate(time.Millisecond)
	out := make([]Issue, 0, n)
	for i := 0; i < n; i++ {
		var kind SampleKind
		switch {
		case i < len(SampleKinds):
			kind = SampleKinds[i]
		case r.IntN(2) == 0:
			kind = SampleFresh
		default:
			kind = SampleKinds[1+r.IntN(len(SampleKinds)-1)]
		}
		out = append(out, sampleIssue(kind, sampleFirstNumber+i, r, now))
	}
	return out
}

func sampleIssue(kind SampleKind, num int, r *rand.Rand, now time.Time) Issue {
	pkg := samplePackages[r.IntN(len(samplePackages))]
	key := sampleProject + "-" + strconv.Itoa(num)
	fix := "rhel-9.6.0"
	if r.IntN(2) == 0 {
		fix = "rhel-10.1"
	}
	is := Issue{
		Key:         key,
		Summary:     fmt.Sprintf("[%s] CVE-2025-%d %s: sample vulnerability", kind, 10000+num, pkg),
		Status:      "New",
		Components:  []string{pkg},
		FixVersions: []string{fix},
		Created:     now.Add(-30 * 24 * time.Hour),
		Updated:     now.Add(-sampleFreshAge),
		Fields:      map[string]any{SampleComponentField: pkg},
	}
	addedBy := func(u jira.User, label string, from []string) {
		is.Changelog = append(is.Changelog, jira.ChangelogEntry{
			ID: strconv.Itoa(num*10 + len(is.Changelog)), Author: u, Created: jira.Time{Time: is.Updated},
			Items: []jira.ChangeItem{{Field: "labels", FieldType: "jira",
				FromString: strings.Join(from, " "), ToString: strings.Join(append(append([]string(nil), from...), label), " ")}},
		})
		is.Labels = append(append([]string(nil), from...), label)
	}
	switch kind {
	case SampleFresh:
	case SampleTodo:
		addedBy(SampleMaintainer, "ymir_todo", nil)
	case SampleTodoOutsider:
		addedBy(SampleOutsider, "ymir_todo", nil)
	case SampleRetry:
		is.Labels = []string{"ymir_retry_needed"}
	case SampleStaleInFlight:
		is.Labels = []string{sampleTriageInProgress}
		is.Updated = now.Add(-sampleStaleAge)
	case SampleStaleTriaged:
		is.Labels = []string{"ymir_triaged_backport"}
		is.Updated = now.Add(-sampleStaleAge)
		is.Status = "In Progress"
	case SampleFreshInFlight:
		is.Labels = []string{sampleTriageInProgress}
		is.Status = "In Progress"
	case SampleModular:
		is.Fields[SampleComponentField] = sampleModularComponent
	case SampleModularTodo:
		is.Fields[SampleComponentField] = sampleModularComponent2
		addedBy(SampleMaintainer, "ymir_todo", nil)
	case SampleTriaged:
		is.Labels = []string{sampleTriaged[r.IntN(len(sampleTriaged))]}
	case SampleDone:
		is.Labels = []string{"ymir_triaged_backport", sampleDone[r.IntN(len(sampleDone))]}
		is.Status = "Closed"
	case SampleTodoInProgress:
		is.Status = "In Progress"
		addedBy(SampleMaintainer, "ymir_todo", []string{sampleTriageInProgress})
	case SampleRetryInFlight:
		is.Labels = []string{"ymir_retry_needed", sampleTriageInProgress}
		is.Status = "In Progress"
	}
	return is
}
