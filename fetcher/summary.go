package fetcher

import (
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Reason is why an issue was not published.
type Reason string

// Reasons, as counted in Summary.Skipped.
const (
	// ReasonLocked: a stage holds a lease on the issue. Its trigger label is left in place;
	// the first sweep after the lease is released takes it.
	ReasonLocked Reason = "locked"
	// ReasonQueued: an entry for the issue still waits in a triage stream (published, not
	// yet acked). Labels are left alone.
	ReasonQueued Reason = "queued"
	// ReasonLabelled: the issue carries ymir_* labels that say it is being, or has been,
	// worked on (upstream rules C and D).
	ReasonLabelled Reason = "labelled"
	// ReasonModular: a modular package; its ymir_todo, if any, is removed.
	ReasonModular Reason = "modular"
	// ReasonMaxIssues: MAX_ISSUES issues were already published by this sweep.
	ReasonMaxIssues Reason = "max-issues"
	// ReasonUntrusted: ymir_todo was added by someone outside JIRA_TRIGGER_GROUP (or by
	// nobody the changelog knows); the label is removed.
	ReasonUntrusted Reason = "untrusted"
	// ReasonError: a Jira call about this issue failed (not 401); retried next sweep.
	ReasonError Reason = "error"
	// ReasonInvalidKey: the issue key is not a valid Jira key.
	ReasonInvalidKey Reason = "invalid-key"
	// ReasonDuplicate: the same issue came twice in one search.
	ReasonDuplicate Reason = "duplicate"
)

// summaryReasons is the order reasons are printed in.
var summaryReasons = []Reason{ReasonLocked, ReasonQueued, ReasonLabelled, ReasonModular, ReasonMaxIssues,
	ReasonUntrusted, ReasonError, ReasonInvalidKey, ReasonDuplicate}

// Outcome is what one sweep did with one issue.
type Outcome struct {
	Key string
	// Published is true when a triage request was appended for the issue; Stream and
	// EntryID name it.
	Published bool
	Stream    string
	EntryID   string
	// Trigger is why the issue was (or would have been) published.
	Trigger Trigger
	// Reason is why it was not published ("" when it was).
	Reason Reason
	// Stage is the stage whose lease was found (ReasonLocked).
	Stage string
	// Added and Removed are the labels the sweep changed (or, in dry run, would have).
	Added, Removed []string
	// FlipErr is the Jira error of a label flip that failed after the publish.
	FlipErr error
	// Detail explains the decision.
	Detail string
}

// Summary is the result of one sweep.
type Summary struct {
	// Found is the number of issues the search returned.
	Found int
	// Published is the number of triage requests appended.
	Published int
	// Skipped counts the issues not published, by reason.
	Skipped map[Reason]int
	// LabelWrites is the number of Jira label updates made (in dry run: logged only).
	LabelWrites int
	// FlipFailures counts label flips that failed after their publish (the event is out;
	// the queued marker keeps the next sweep from publishing it again).
	FlipFailures int
	// DryRun is true when no Jira write was sent.
	DryRun bool
	// Took is the sweep's duration.
	Took time.Duration
	// Issues holds one outcome per issue, in Jira's order.
	Issues []Outcome
}

// Outcome returns the outcome for key.
func (s Summary) Outcome(key string) (Outcome, bool) {
	for _, o := range s.Issues {
		if o.Key == key {
			return o, true
		}
	}
	return Outcome{}, false
}

// PublishedKeys lists the issues published, in order.
func (s Summary) PublishedKeys() []string {
	var out []string
	for _, o := range s.Issues {
		if o.Published {
			out = append(out, o.Key)
		}
	}
	return out
}

// String is the one-line human summary, e.g. "found 12, published 4, skipped 8 (locked 1,
// queued 2, labelled 3, modular 1, max-issues 1) in 1.2s".
func (s Summary) String() string {
	var b strings.Builder
	skipped := 0
	for _, n := range s.Skipped {
		skipped += n
	}
	fmt.Fprintf(&b, "found %d, published %d, skipped %d (", s.Found, s.Published, skipped)
	for i, r := range summaryReasons {
		n := s.Skipped[r]
		if i >= 5 && n == 0 {
			continue
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", r, n)
	}
	b.WriteString(")")
	if s.FlipFailures > 0 {
		fmt.Fprintf(&b, ", %d label flips failed after publish", s.FlipFailures)
	}
	if s.DryRun {
		b.WriteString(", dry run")
	}
	fmt.Fprintf(&b, " in %s", s.Took.Round(time.Millisecond))
	return b.String()
}

// MarshalZerologObject implements zerolog.LogObjectMarshaler.
func (s Summary) MarshalZerologObject(e *zerolog.Event) {
	e.Int("found", s.Found).Int("published", s.Published)
	for _, r := range summaryReasons {
		e.Int("skipped_"+strings.ReplaceAll(string(r), "-", "_"), s.Skipped[r])
	}
	e.Int("label_writes", s.LabelWrites).Int("flip_failures", s.FlipFailures).Bool("dry_run", s.DryRun).
		Dur("took", s.Took)
}
