package progress

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Display shows progress: on a terminal (live) a block of lines redrawn in place (ANSI
// cursor-up and erase-line), elsewhere a plain status line now and then and never a
// cursor control. Lines written with Linef stay above the live block.
type Display struct {
	mu    sync.Mutex
	w     io.Writer
	live  bool
	every time.Duration

	drawn     int    // lines of the live block on screen
	lastBlock string // the live block on screen, joined
	lastPlain time.Time
	lastText  string
}

// NewDisplay returns a display writing to w (nil: nothing is shown). Without live, a
// status line is printed at most every plainEvery, and only when it changed.
func NewDisplay(w io.Writer, live bool, plainEvery time.Duration) *Display {
	return &Display{w: w, live: live, every: plainEvery}
}

// Live reports whether the display redraws in place.
func (d *Display) Live() bool { return d.live }

// Linef prints a permanent line (above the live block, which is redrawn at the next
// Status).
func (d *Display) Linef(format string, args ...any) {
	if d.w == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clearLocked()
	fmt.Fprintf(d.w, format+"\n", args...)
}

// Clear erases the live block.
func (d *Display) Clear() {
	if d.w == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.clearLocked()
}

func (d *Display) clearLocked() {
	if !d.live || d.drawn == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\x1b[%dA", d.drawn)
	for range d.drawn {
		b.WriteString("\x1b[2K\n")
	}
	fmt.Fprintf(&b, "\x1b[%dA", d.drawn)
	_, _ = io.WriteString(d.w, b.String())
	d.drawn = 0
}

// Status shows the current state: block redrawn in place when live, else prefix+plain
// as a line at most every plainEvery, and only when plain changed (prefix, e.g. the time,
// does not count). Force prints a changed plain even if it came sooner: a last state,
// which must not be left out.
func (d *Display) Status(block []string, prefix, plain string, force bool) {
	if d.w == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.live {
		if plain == d.lastText || (!force && time.Since(d.lastPlain) < d.every) {
			return
		}
		d.lastText, d.lastPlain = plain, time.Now()
		fmt.Fprintln(d.w, prefix+plain)
		return
	}
	joined := strings.Join(block, "\n")
	if d.drawn > 0 && joined == d.lastBlock {
		return // unchanged: no redraw
	}
	d.lastBlock = joined
	var out strings.Builder
	if d.drawn > 0 {
		fmt.Fprintf(&out, "\x1b[%dA", d.drawn) // back to the top of the block
	}
	for _, l := range block {
		out.WriteString("\r\x1b[2K" + l + "\n")
	}
	if extra := d.drawn - len(block); extra > 0 {
		for range extra {
			out.WriteString("\x1b[2K\n")
		}
		fmt.Fprintf(&out, "\x1b[%dA", extra)
	}
	_, _ = io.WriteString(d.w, out.String())
	d.drawn = len(block)
}
