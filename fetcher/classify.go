package fetcher

import (
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/internal/labels"
)

// DefaultComponentField is the custom field naming the downstream component
// ("Downstream Component Name" on Red Hat's Jira).
const DefaultComponentField = "customfield_10669"

// modularPattern matches a modular package name such as perl:5.32/perl.
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var modularPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^.+:.+/.+$`) })

// Trigger is why an issue is published.
type Trigger string

// Triggers.
const (
	TriggerFresh Trigger = "fresh"             // no ymir_* label
	TriggerTodo  Trigger = labels.Todo         // a trusted maintainer asked (user-triggered, :todo stream)
	TriggerRetry Trigger = labels.RetryNeeded  // a stage asked for a retry
	TriggerStale Trigger = "stale"             // an in-flight label went stale: recovered
	triggerNone  Trigger = ""                  // nothing to publish
	triggerTodoM Trigger = "ymir_todo/modular" // modular ymir_todo: consumed, not published
)

// decision is the outcome of pass 1 (classification, no I/O) for one issue.
type decision struct {
	trigger Trigger
	// staleLabel is the in-flight label to recover (TriggerStale).
	staleLabel string
	// skip is the reason when nothing is to be done (trigger == triggerNone).
	skip Reason
	// why explains the decision for the log.
	why string
}

// hasInProgress reports whether any ymir_ label ends with _in_progress (upstream
// has_in_progress: ymir_triage_in_progress, ymir_reproducer_in_progress; not ymir_triaged_*).
func hasInProgress(ymir []string) bool {
	for _, l := range ymir {
		if strings.HasSuffix(l, labels.InProgressSuffix) {
			return true
		}
	}
	return false
}

// isStale reports whether an issue last updated at updated is older than threshold at now.
// A zero (missing) timestamp is never stale.
func isStale(updated, now time.Time, threshold time.Duration) bool {
	if updated.IsZero() {
		return false
	}
	return now.Sub(updated) > threshold
}

// isStaleRaw is isStale on Jira's text form: Jira's +0000 offsets, RFC 3339 and naive
// timestamps (read as UTC) are understood; an empty or unparseable one is not stale.
func isStaleRaw(updated string, now time.Time, threshold time.Duration) bool {
	t, err := jira.ParseTime(updated)
	if err != nil {
		return false
	}
	return isStale(t, now, threshold)
}

// findStaleInFlightLabel returns the in-flight label to recover, or "" (upstream
// _find_stale_in_flight_label). ymir_reproducer_in_progress is blocked only by another
// ymir_reproducer_* label; every other in-flight label by any other ymir_* label except
// the triggers ymir_retry_needed and ymir_todo. The label must also be stale: the issue
// not updated for threshold.
func findStaleInFlightLabel(issueLabels []string, updated, now time.Time, threshold time.Duration) string {
	ymir := labels.Ymir(issueLabels)
	for _, cand := range labels.InFlight() {
		if !slices.Contains(ymir, cand) {
			continue
		}
		blocked := false
		for _, other := range ymir {
			if other == cand {
				continue
			}
			if cand == labels.ReproducerInProgress {
				blocked = strings.HasPrefix(other, labels.ReproducerPrefix)
			} else {
				blocked = other != labels.RetryNeeded && other != labels.Todo
			}
			if blocked {
				break
			}
		}
		if blocked {
			continue
		}
		if isStale(updated, now, threshold) {
			return cand
		}
	}
	return ""
}

// isModular reports whether the issue's downstream component (the custom field, or a
// component name) names a modular package such as perl:5.32/perl.
func isModular(is jira.Issue, componentField string) bool {
	if componentField != "" {
		var v any
		if ok, _ := is.Fields.Field(componentField, &v); ok {
			for _, s := range componentNames(v) {
				if modularPattern().MatchString(s) {
					return true
				}
			}
		}
	}
	for _, c := range is.Fields.Components {
		if modularPattern().MatchString(c.Name) {
			return true
		}
	}
	return false
}

// componentNames reads a component field that is a string, an object with a name or
// value, or a list of those.
func componentNames(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case map[string]any:
		for _, k := range []string{"value", "name"} {
			if s, ok := x[k].(string); ok {
				return []string{s}
			}
		}
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, componentNames(e)...)
		}
		return out
	}
	return nil
}

// classify applies rules A–D (docs/architecture.md, "The fetcher's rules") to one issue. The author check of
// rule A, the lock and queue checks and MAX_ISSUES come later; the modular skip is applied
// here, after the rules, as upstream did (only issues that would be published are counted
// as modular), except that a modular ymir_todo is consumed (the Python fetcher left it
// to be re-checked every sweep).
func classify(is jira.Issue, now time.Time, threshold time.Duration, componentField string) decision {
	issueLabels := is.Fields.Labels
	ymir := labels.Ymir(issueLabels)
	inProgress := hasInProgress(ymir)
	hasTodo := slices.Contains(ymir, labels.Todo)
	hasRetry := slices.Contains(ymir, labels.RetryNeeded)

	var d decision
	switch {
	case slices.Contains(ymir, labels.BudgetExhausted):
		// Parked for its budget: re-running it would be denied again and spend on the
		// way; only a maintainer's approval (the webhook) resumes its parked requests.
		return decision{skip: ReasonLabelled, why: labels.BudgetExhausted + ": parked until a maintainer approves more budget"}
	case len(ymir) == 0:
		d = decision{trigger: TriggerFresh, why: "no ymir_* label"}
	case hasTodo && !inProgress: // A
		d = decision{trigger: TriggerTodo, why: "ymir_todo without an in-progress label"}
	default:
		if l := findStaleInFlightLabel(issueLabels, is.Fields.Updated.Time, now, threshold); l != "" { // B
			d = decision{trigger: TriggerStale, staleLabel: l, why: l + " not updated for " + threshold.String()}
			break
		}
		switch {
		case !hasRetry: // C
			d = decision{skip: ReasonLabelled, why: "ymir_* labels " + strings.Join(ymir, ",")}
		case inProgress: // D, in progress
			d = decision{skip: ReasonLabelled, why: "ymir_retry_needed while in progress"}
		default: // D
			d = decision{trigger: TriggerRetry, why: "ymir_retry_needed"}
		}
	}
	if d.trigger != triggerNone && isModular(is, componentField) {
		if d.trigger == TriggerTodo {
			return decision{trigger: triggerTodoM, why: "modular component: ymir_todo is consumed, not published"}
		}
		return decision{skip: ReasonModular, why: "modular component"}
	}
	return d
}
