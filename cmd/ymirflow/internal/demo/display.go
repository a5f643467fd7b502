package demo

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// display shows the demo's progress: on a terminal a block of live counters redrawn in
// place (ANSI cursor-up and erase-line), elsewhere a plain line now and then. Lines
// written with linef stay above the live block.
type display struct {
	mu    sync.Mutex
	w     io.Writer
	live  bool
	every time.Duration
	phase string

	drawn     int // lines of the live block on screen
	lastPlain time.Time
	lastText  string
}

func newDisplay(w io.Writer, live bool) *display {
	return &display{w: w, live: live, every: time.Second}
}

// linef prints a permanent line (above the live block, which is redrawn at the next
// update).
func (d *display) linef(format string, args ...any) {
	if d.w == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clearLocked()
	fmt.Fprintf(d.w, format+"\n", args...)
}

// clear erases the live block.
func (d *display) clear() {
	if d.w == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clearLocked()
}

func (d *display) clearLocked() {
	if !d.live || d.drawn == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\x1b[%dA", d.drawn)
	for range d.drawn {
		b.WriteString("\x1b[2K\n")
	}
	fmt.Fprintf(&b, "\x1b[%dA", d.drawn)
	io.WriteString(d.w, b.String())
	d.drawn = 0
}

// update shows a snapshot: redrawn in place when live, else a plain line at most every
// d.every (and only when something changed).
func (d *display) update(elapsed time.Duration, snap snapshot) {
	if d.w == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	t := snap.total
	if !d.live {
		text := fmt.Sprintf("published %d, running %d, succeeded %d, failed %d, dropped %d, retried %d, dead %d",
			t.Published, t.Running, t.Succeeded, t.Failed, t.Dropped, t.Retried, t.Dead)
		if text == d.lastText || time.Since(d.lastPlain) < d.every {
			return
		}
		d.lastText, d.lastPlain = text, time.Now()
		fmt.Fprintf(d.w, "%6.1fs  %s\n", elapsed.Seconds(), text)
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
	for _, st := range snap.stages {
		row(st)
	}
	row(t)
	_ = tw.Flush()
	lines := strings.SplitAfter(strings.TrimSuffix(b.String(), "\n"), "\n")
	var out strings.Builder
	if d.drawn > 0 {
		fmt.Fprintf(&out, "\x1b[%dA", d.drawn) // back to the top of the block
	}
	for _, l := range lines {
		out.WriteString("\r\x1b[2K" + strings.TrimSuffix(l, "\n") + "\n")
	}
	if extra := d.drawn - len(lines); extra > 0 {
		for range extra {
			out.WriteString("\x1b[2K\n")
		}
		fmt.Fprintf(&out, "\x1b[%dA", extra)
	}
	io.WriteString(d.w, out.String())
	d.drawn = len(lines)
}
