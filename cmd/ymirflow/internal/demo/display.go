package demo

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/progress"
)

// display shows the demo's progress (progress.Display): on a terminal a table of live
// counters per stage, elsewhere a plain line at most every second.
type display struct {
	*progress.Display
	phase string
}

func newDisplay(w io.Writer, live bool) *display {
	return &display{Display: progress.NewDisplay(w, live, time.Second)}
}

func (d *display) linef(format string, args ...any) { d.Linef(format, args...) }

func (d *display) clear() { d.Clear() }

// update shows a snapshot; final prints it even when a plain line came less than a
// second ago, so that the last line shown agrees with the summary.
func (d *display) update(elapsed time.Duration, snap progress.Snapshot, final bool) {
	t := snap.Total
	prefix := fmt.Sprintf("%6.1fs  ", elapsed.Seconds())
	plain := fmt.Sprintf("published %d, running %d, succeeded %d, failed %d, dropped %d, retried %d, dead %d",
		t.Published, t.Running, t.Succeeded, t.Failed, t.Dropped, t.Retried, t.Dead)
	if !d.Live() {
		d.Status(nil, prefix, plain, final)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%6.1fs  %s: %d of %d events have an outcome, %d running\n", elapsed.Seconds(), d.phase,
		t.Outcomes, t.Published, t.Running)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-13s\tpublished\trunning\tsucceeded\tfailed\tdropped\tretried\tdead\t\n", "stage")
	row := func(st StageStats) {
		fmt.Fprintf(tw, "%-13s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", st.Stage, st.Published, st.Running, st.Succeeded,
			st.Failed, st.Dropped, st.Retried, st.Dead)
	}
	for _, st := range snap.Stages {
		row(st)
	}
	row(t)
	_ = tw.Flush()
	d.Status(strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"), prefix, plain, final)
}
