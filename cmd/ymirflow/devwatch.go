package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/progress"
	"github.com/ymirflow/ymirflow/event"
)

// Pace of dev's display: how often it reads the results and dead-letter streams, how
// many outcome lines a second it prints at most, and how often a plain status line
// (stdout not a terminal) may repeat.
const (
	devWatchEvery     = 250 * time.Millisecond
	devLinesPerSecond = 4
	devPlainEvery     = 10 * time.Second
)

// devWatch is dev's display: what the pipeline does, read from the results and
// dead-letter streams (the records `ymirflow history` shows), as one line per outcome
// (at most devLinesPerSecond) above live counters per stage, and a summary at the end.
type devWatch struct {
	tally *progress.Tally
	disp  *progress.Display
	lines progress.Lines
	start time.Time
	snap  progress.Snapshot
	err   error // the last read's failure, shown once
}

// newDevWatch returns dev's display of topo's streams on rdb, writing to w (live:
// redrawn in place on a terminal). It counts from now: records already in the streams
// (a real Redis's earlier runs) are not shown.
func newDevWatch(ctx context.Context, rdb redis.UniversalClient, topo event.Topology, w io.Writer, live bool) (*devWatch, error) {
	dw := &devWatch{tally: progress.NewTally(rdb, topo), disp: progress.NewDisplay(w, live, devPlainEvery), start: time.Now()}
	if err := dw.tally.SkipExisting(ctx); err != nil {
		return nil, err
	}
	dw.lines = progress.Lines{PerSecond: devLinesPerSecond, Print: func(l string) { dw.disp.Linef("%s", l) }}
	dw.tally.OnResult = func(stage string, rec event.Record, field func(string) string) {
		if l := devOutcomeLine(dw.tally, stage, rec, field); l != "" {
			dw.lines.Add(l)
		}
	}
	dw.tally.OnDead = func(stage, issue, reason string) {
		dw.lines.Add(fmt.Sprintf("%s %s dead-lettered: %s", issue, stageWords(stage), clip(reason, 120)))
	}
	return dw, nil
}

// run shows progress until ctx ends.
func (dw *devWatch) run(ctx context.Context) {
	tick := time.NewTicker(devWatchEvery)
	defer tick.Stop()
	for {
		dw.step(ctx, false)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// step reads what was recorded since the last step and shows it.
func (dw *devWatch) step(ctx context.Context, final bool) {
	snap, err := dw.tally.Take(ctx, nil)
	if err != nil {
		if ctx.Err() == nil && (dw.err == nil || dw.err.Error() != err.Error()) {
			dw.disp.Linef("ymirflow dev: display: %v", err)
		}
		dw.err = err
		return
	}
	dw.err, dw.snap = nil, snap
	dw.lines.Flush()
	t := snap.Total
	plain := fmt.Sprintf("runs done %d (failed %d), running %d, dropped %d, delivered %d, dead-lettered %d",
		t.Succeeded+t.Failed, t.Failed, t.Pending, t.Dropped, t.Delivered, t.Dead)
	prefix := "ymirflow dev: " + time.Since(dw.start).Round(time.Second).String() + ": "
	block := append([]string{prefix + plain}, dw.table(false)...)
	dw.disp.Status(block, prefix, plain, final)
}

// summary reads the streams a last time (the components have stopped) and prints the
// totals per stage and outcome, and how long dev ran.
func (dw *devWatch) summary(ctx context.Context, w io.Writer) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dw.step(ctx, true)
	dw.disp.Clear()
	if dw.lines.Skipped() > 0 {
		dw.lines.Print(fmt.Sprintf("… %d more (ymirflow history ISSUE, or the console, has them all)", dw.lines.Skipped()))
	}
	t := dw.snap.Total
	fmt.Fprintf(w, "ymirflow dev: ran %s: %d runs done (%d failed), %d dropped or coalesced, %d delivered to a running agent, %d dead-lettered\n",
		time.Since(dw.start).Round(time.Second), t.Succeeded+t.Failed, t.Failed, t.Dropped, t.Delivered, t.Dead)
	for _, l := range dw.table(true) {
		fmt.Fprintln(w, l)
	}
	if t.Pending > 0 {
		fmt.Fprintf(w, "  %d entries were in flight at the stop: a worker runs them when it starts again (on a real Redis)\n", t.Pending)
	}
}

// table is the counters per stage; with outcomes, the count of each outcome
// (resolutions, labels, drops, ...) too, and stages where nothing happened left out.
func (dw *devWatch) table(outcomes bool) []string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	head := "  stage\truns done\tfailed\trunning\tdropped\tdelivered\tdead\t"
	if outcomes {
		head = "  stage\truns done\tfailed\tdropped\tdelivered\tdead\toutcomes"
	}
	fmt.Fprintln(tw, head)
	row := func(st progress.StageStats) {
		if outcomes {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\n", st.Stage, st.Succeeded+st.Failed, st.Failed, st.Dropped, st.Delivered,
				st.Dead, kindsText(dw.tally.Kinds(st.Stage)))
			return
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", st.Stage, st.Succeeded+st.Failed, st.Failed, st.Pending, st.Dropped,
			st.Delivered, st.Dead)
	}
	for _, st := range dw.snap.Stages {
		if !outcomes || len(dw.tally.Kinds(st.Stage)) > 0 || st.Pending > 0 {
			row(st)
		}
	}
	if !outcomes {
		row(dw.snap.Total)
	}
	_ = tw.Flush()
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}

// kindsText is "rebase 4, backport 2, skipped 1": the most frequent first.
func kindsText(kinds map[string]int) string {
	keys := slices.Sorted(maps.Keys(kinds))
	slices.SortStableFunc(keys, func(a, b string) int { return kinds[b] - kinds[a] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, kinds[k])
	}
	return strings.Join(parts, ", ")
}

// stageWords is a stage's group name as words: "rebase c9s".
func stageWords(stage string) string { return strings.Replace(stage, "-", " ", 1) }

// devOutcomeLine is one results record as a line of dev's display, e.g.
// "RHEL-1001 triaged → rebase c10s" or "RHEL-1004 rebase c9s done (fence 3)"; "" for
// records not worth a line.
func devOutcomeLine(t *progress.Tally, stage string, rec event.Record, field func(string) string) string {
	var d map[string]any
	_ = json.Unmarshal([]byte(rec.Detail), &d)
	ds := func(k string) string { s, _ := d[k].(string); return s }
	who, fence := rec.IssueKey+" "+stageWords(stage), ""
	if rec.Fence != "" {
		fence = " (fence " + rec.Fence + ")"
	}
	comment := func() string {
		c := "comment " + ds("followup_comment_id")
		if a := ds("followup_author"); a != "" {
			c += " by " + a
		}
		return c
	}
	switch rec.EventType {
	case event.StageDone:
		switch {
		case rec.Outcome == "skipped":
			return fmt.Sprintf("%s skipped: %s%s", who, clip(ds("reason"), 100), unseenText(d["followups_unseen"]))
		case stage != "triage":
			return fmt.Sprintf("%s done%s", who, fence)
		case ds("stream") != "":
			return fmt.Sprintf("%s triaged → %s", rec.IssueKey, stageWords(t.StageOf(ds("stream"))))
		case ds("reason") != "":
			return fmt.Sprintf("%s triaged: %s (%s)", rec.IssueKey, rec.Outcome, ds("reason"))
		}
		return fmt.Sprintf("%s triaged: %s", rec.IssueKey, rec.Outcome)
	case event.StageFailed:
		return fmt.Sprintf("%s failed: %s", who, clip(ds("error"), 120))
	case event.LockDropped:
		return fmt.Sprintf("%s: dropped, the issue is held (fence %s)", who, field("holder_fence"))
	case event.LockCoalesced:
		return fmt.Sprintf("%s: queued behind the run holding the issue (fence %s)", who, field("holder_fence"))
	case event.LockDelayed:
		return fmt.Sprintf("%s: delayed, the issue is held (fence %s)", who, field("holder_fence"))
	case event.LockWaited:
		return fmt.Sprintf("%s: waits in line for the issue (place %s, fence %s holds it)", who, field("position"), field("holder_fence"))
	case event.LockSuperseded:
		return fmt.Sprintf("%s: superseded by a newer event", who)
	case event.LockDelivered:
		return fmt.Sprintf("%s: a follow-up reached the running agent's mailbox (fence %s)", who, field("holder_fence"))
	case event.FollowupDelivered:
		return fmt.Sprintf("%s: the running agent acknowledged %s%s", who, comment(), fence)
	case event.FollowupRolled:
		return fmt.Sprintf("%s: %s met no live run: handed to this run in its Task JSON%s", who, comment(), fence)
	}
	return ""
}

// unseenText is "; comment 10023 by ann reached no agent" for each follow-up a skipped
// run names in followups_unseen: a maintainer's comment whose run ended before it came.
func unseenText(v any) string {
	list, _ := v.([]any)
	var b strings.Builder
	for _, x := range list {
		f, _ := x.(map[string]any)
		id, _ := f["followup_comment_id"].(string)
		if id == "" {
			id, _ = f["followup_id"].(string)
		}
		b.WriteString("; comment " + id)
		if a, _ := f["followup_author"].(string); a != "" {
			b.WriteString(" by " + a)
		}
		b.WriteString(" reached no agent (its run had ended)")
	}
	return b.String()
}
