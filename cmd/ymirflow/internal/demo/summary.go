package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Summary is what a demo did, computed from the streams (results, dead letters, input
// streams), the handlers' counts and the fake Jira's labels at the end.
type Summary struct {
	Redis     string `json:"redis"`     // URL without password
	Embedded  bool   `json:"embedded"`  // the embedded Redis (miniredis)
	Namespace string `json:"namespace"` // YMIR_NAMESPACE of the run
	Issues    int    `json:"issues"`
	Seed      int64  `json:"seed"`
	// AgentDuration is the typical simulated run; MaxRetries the attempts per event;
	// Workers the workers per stage.
	AgentDuration string `json:"agent_duration"`
	MaxRetries    int    `json:"max_retries"`
	Workers       int    `json:"workers_per_stage"`
	Took          string `json:"took"`
	Interrupted   bool   `json:"interrupted,omitempty"`
	Phase         string `json:"phase"` // the last phase reached
	Error         string `json:"error,omitempty"`

	// Sweeps are the fetcher's two sweeps.
	Sweeps []SweepSummary `json:"sweeps"`
	// Duplicates are the events published twice on purpose.
	Duplicates Duplicates `json:"duplicates"`
	// Stages and Total: per stage, published, run, dropped, retried, succeeded, failed,
	// dead, pending and outcomes.
	Stages []StageStats `json:"stages"`
	Total  StageStats   `json:"total"`
	// DropReasons counts the lock.dropped records by reason: "locked" (the holder was at
	// work) or "superseded" (the event entered its stream before the holder's run ended).
	DropReasons map[string]int `json:"drop_reasons"`
	// Unaccounted is the number of published events without an outcome; Repeats lists
	// entries with more than one. Both are empty after a complete demo.
	Unaccounted int      `json:"unaccounted"`
	Repeats     []string `json:"repeats,omitempty"`
	// Followups are the maintainers' comments planned during a run (Scenario.Comment),
	// each with its fate; OwnComments counts the comments of ymirflow's own account
	// the webhook received and never delivered.
	Followups   []FollowupResult `json:"followups"`
	OwnComments int              `json:"own_comments_ignored"`
	// IssueResults has every issue's final labels in the fake Jira, against the plan.
	IssueResults []IssueResult `json:"issue_results"`
	AsPlanned    int           `json:"as_planned"`
	LogFile      string        `json:"log_file,omitempty"`
}

// SweepSummary is one fetcher sweep.
type SweepSummary struct {
	Found     int            `json:"found"`
	Published int            `json:"published"`
	Skipped   map[string]int `json:"skipped"`
	Text      string         `json:"text"`
}

// Duplicates are the events published twice on purpose.
type Duplicates struct {
	// Triage: fetcher requests appended a second time; Enqueued: downstream requests
	// enqueued twice by hand. Each makes one event that the lock must drop.
	Triage   int      `json:"triage"`
	Enqueued int      `json:"enqueued"`
	Keys     []string `json:"keys"`
}

// Count is the number of events the lock must drop.
func (d Duplicates) Count() int { return d.Triage + d.Enqueued }

// FollowupResult is a maintainer's comment made while a run of its issue was at work.
type FollowupResult struct {
	Key       string `json:"key"`
	Stage     string `json:"stage"`
	CommentID string `json:"comment_id"`
	Author    string `json:"author"`
	// Body is the text the agent read (redacted and bounded by the webhook).
	Body string `json:"body,omitempty"`
	// Fate is the follow-up's record: followup.delivered (the running agent read and
	// acknowledged it), followup.rolled (handed to the next run); "" when none.
	Fate string `json:"fate"`
}

// Delivered reports whether the running agent got the comment and acknowledged it.
func (f FollowupResult) Delivered() bool { return f.Fate == "followup.delivered" }

// followupsDelivered reports whether every planned follow-up was delivered.
func (s *Summary) followupsDelivered() bool {
	for _, f := range s.Followups {
		if !f.Delivered() {
			return false
		}
	}
	return true
}

// IssueResult is one issue at the end.
type IssueResult struct {
	Key       string   `json:"key"`
	Path      string   `json:"path"`
	Labels    []string `json:"labels"`
	Expected  []string `json:"expected"`
	AsPlanned bool     `json:"as_planned"`
}

// Stage returns the stats of a stage by name (triage, rebase-c9s, ...).
func (s *Summary) Stage(name string) (StageStats, bool) {
	for _, st := range s.Stages {
		if st.Stage == name {
			return st, true
		}
	}
	return StageStats{}, false
}

// Complete reports whether every published event has exactly one outcome, nothing is
// pending, every issue ended with the labels its scenario plans and every planned
// follow-up reached its running agent.
func (s *Summary) Complete() bool {
	return !s.Interrupted && s.Error == "" && s.Unaccounted == 0 && len(s.Repeats) == 0 && s.Total.Pending == 0 &&
		s.AsPlanned == len(s.IssueResults) && len(s.IssueResults) > 0 && s.followupsDelivered()
}

// WriteJSON writes the summary as indented JSON.
func (s *Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// WriteTable writes the per-stage table.
func (s *Summary) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-13s\tpublished\trun\tdropped\tdelivered\tretried\tsucceeded\tfailed\tdead\t\n", "stage")
	row := func(st StageStats) {
		fmt.Fprintf(tw, "%-13s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", st.Stage, st.Published, st.Run, st.Dropped, st.Delivered,
			st.Retried, st.Succeeded, st.Failed, st.Dead)
	}
	for _, st := range s.Stages {
		row(st)
	}
	row(s.Total)
	_ = tw.Flush()
}

// featured picks a few issues that show the interesting paths, in key order.
func (s *Summary) featured(n int) []IssueResult {
	want := []func(p string) bool{
		func(p string) bool { return strings.Contains(p, "comments during") },
		func(p string) bool { return strings.Contains(p, "published twice") },
		func(p string) bool { return strings.Contains(p, "failure, success") },
		func(p string) bool { return strings.Contains(p, "(dead)") && strings.Contains(p, "-c") },
		func(p string) bool { return strings.HasPrefix(p, "todo →") },
		func(p string) bool { return strings.Contains(p, "triage: error") && strings.HasSuffix(p, "(dead)") },
		func(p string) bool { return strings.Contains(p, "enqueued twice") },
		func(p string) bool { return strings.Contains(p, "non-member") },
		func(p string) bool { return strings.HasPrefix(p, "stale") },
		func(p string) bool { return strings.Contains(p, "modular") },
	}
	var out []IssueResult
	used := map[string]bool{}
	for _, f := range want {
		for _, ir := range s.IssueResults {
			if !used[ir.Key] && f(ir.Path) {
				used[ir.Key] = true
				out = append(out, ir)
				break
			}
		}
		if len(out) == n {
			break
		}
	}
	slices.SortFunc(out, func(a, b IssueResult) int { return strings.Compare(padKey(a.Key), padKey(b.Key)) })
	return out
}

// WriteText writes the human report: the table, the checks, a few issues and the
// commands to look closer. keep tells whether the data outlives the process.
func (s *Summary) WriteText(w io.Writer, keep bool) {
	fmt.Fprintln(w)
	s.WriteTable(w)
	fmt.Fprintln(w)
	t := s.Total
	if s.Interrupted {
		fmt.Fprintf(w, "Stopped before the end: %d of %d published events had an outcome, %d were pending.\n",
			t.Outcomes, t.Published, t.Pending)
		if !s.Embedded && keep {
			fmt.Fprintf(w, "Namespace %s is kept:\n", s.Namespace)
			s.commands(w, "RHEL-1001")
		}
		return
	}
	s.writeChecks(w)
	feat := s.featured(8)
	writeFeatured(w, feat)
	s.writeCloser(w, feat, keep)
	// The demo is often the first thing run, with `go run`: say where the binary the
	// lines above name comes from, and what keeps a pipeline up.
	fmt.Fprintln(w, "(ymirflow is `go install ./cmd/ymirflow`; `ymirflow dev` keeps a whole pipeline running until Ctrl-C.)")
	if s.LogFile != "" {
		fmt.Fprintf(w, "Logs of every worker: %s\n", s.LogFile)
	}
}

// mark is a check's verdict as WriteText prints it.
func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "NOT OK"
}

// writeChecks writes WriteText's checks of a run that ended: one line each, and the
// issues or events that fail them.
func (s *Summary) writeChecks(w io.Writer) {
	t := s.Total
	accounted := s.Unaccounted == 0 && len(s.Repeats) == 0 && t.Pending == 0
	fmt.Fprintf(w, "  %-6s every published event has exactly one outcome: %d published = %d run + %d dropped + %d delivered; %d pending\n",
		mark(accounted && t.Published == t.Run+t.Dropped+t.Delivered), t.Published, t.Run, t.Dropped, t.Delivered, t.Pending)
	var reasons []string
	for _, k := range []string{"locked", "superseded"} {
		if n := s.DropReasons[k]; n > 0 {
			reasons = append(reasons, fmt.Sprintf("%d %s", n, k))
		}
	}
	for k, n := range s.DropReasons {
		if k != "locked" && k != "superseded" {
			reasons = append(reasons, fmt.Sprintf("%d %s", n, k))
		}
	}
	fmt.Fprintf(w, "  %-6s dropped by the lock: %d (%s), the %d duplicates published on purpose\n",
		mark(t.Dropped == s.Duplicates.Count()), t.Dropped, strings.Join(reasons, ", "), s.Duplicates.Count())
	fmt.Fprintf(w, "  %-6s run = succeeded + failed: %d = %d + %d; every failed event is in the dead-letter stream (%d)\n",
		mark(t.Run == t.Succeeded+t.Failed && t.Failed == t.Dead), t.Run, t.Succeeded, t.Failed, t.Dead)
	if len(s.Followups) > 0 {
		n := 0
		for _, f := range s.Followups {
			if f.Delivered() {
				n++
			}
		}
		fmt.Fprintf(w, "  %-6s follow-ups: %d of %d maintainer comments made during a run reached the running agent (%d of ymirflow's own account's not delivered)\n",
			mark(s.followupsDelivered()), n, len(s.Followups), s.OwnComments)
		for _, f := range s.Followups {
			fate := "acknowledged by the run (" + f.Fate + ")"
			if !f.Delivered() {
				fate = "NOT delivered (" + f.Fate + ")"
			}
			fmt.Fprintf(w, "         %s: comment %s by %s reached its %s run: %q, %s\n", f.Key, f.CommentID, f.Author, f.Stage, f.Body, fate)
		}
	}
	fmt.Fprintf(w, "  %-6s Jira labels as planned for %d of %d issues\n",
		mark(s.AsPlanned == len(s.IssueResults)), s.AsPlanned, len(s.IssueResults))
	for _, ir := range s.IssueResults {
		if !ir.AsPlanned {
			fmt.Fprintf(w, "         %s: labels %v, planned %v (%s)\n", ir.Key, ir.Labels, ir.Expected, ir.Path)
		}
	}
	for _, rep := range s.Repeats {
		fmt.Fprintf(w, "         more than one outcome: %s\n", rep)
	}

}

// writeFeatured writes a few issues, with their labels in the fake Jira.
func writeFeatured(w io.Writer, feat []IssueResult) {
	if len(feat) > 0 {
		fmt.Fprintln(w, "\nA few issues, with their labels in the fake Jira at the end:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, ir := range feat {
			labels := strings.Join(ir.Labels, ",")
			if labels == "" {
				labels = "(none)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", ir.Key, labels, ir.Path)
		}
		_ = tw.Flush()
	}

}

// writeCloser writes the commands to look closer at the run, about an example issue
// of feat, as where the data is (embedded or not, kept or not) allows.
func (s *Summary) writeCloser(w io.Writer, feat []IssueResult, keep bool) {
	example := "RHEL-1001"
	for i, ir := range feat {
		if i == 0 || strings.Contains(ir.Path, "published twice") {
			example = ir.Key
		}
		if strings.Contains(ir.Path, "published twice") {
			break
		}
	}
	fmt.Fprintln(w)
	switch {
	case s.Embedded && keep:
		fmt.Fprintf(w, "Look closer while the embedded Redis keeps serving:\n")
		s.commands(w, example)
	case s.Embedded:
		fmt.Fprintf(w, "The embedded Redis ended with the demo. To look closer, run `ymirflow demo --keep` (the embedded\n"+
			"Redis then serves until Ctrl-C) or give it a real Redis (REDIS_URL=redis://127.0.0.1:6379/0 ymirflow demo --keep),\n"+
			"then, with the REDIS_URL and YMIR_NAMESPACE it prints:\n")
		for _, c := range []string{"pending", "locks", "streams", "history " + example, "dlq list"} {
			fmt.Fprintf(w, "  ymirflow %s\n", c)
		}
	case keep:
		fmt.Fprintf(w, "Look closer (namespace %s is kept; delete its keys when done):\n", s.Namespace)
		s.commands(w, example)
	default:
		fmt.Fprintf(w, "Namespace %s was deleted; with --keep it stays, and then:\n", s.Namespace)
		s.commands(w, example)
	}
}

func (s *Summary) commands(w io.Writer, example string) {
	env := fmt.Sprintf("REDIS_URL=%s YMIR_NAMESPACE=%s ", s.Redis, s.Namespace)
	for _, c := range []string{"pending", "locks", "streams", "history " + example, "dlq list"} {
		fmt.Fprintf(w, "  %symirflow %s\n", env, c)
	}
}
