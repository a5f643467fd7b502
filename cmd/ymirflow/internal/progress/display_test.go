package progress_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/progress"
)

// Plain (not a terminal): no cursor control; a status line only when it changed and
// at most once per interval, unless forced (the last one, which must show).
func TestPlainDisplay(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	d := progress.NewDisplay(&b, false, time.Hour)
	d.Status([]string{"block"}, "1s ", "a", false)
	d.Status(nil, "2s ", "a", false) // unchanged
	d.Status(nil, "3s ", "b", false) // too soon
	d.Linef("line %d", 1)            // permanent lines are never held back
	d.Status(nil, "4s ", "b", true)  // forced
	d.Status(nil, "5s ", "b", true)  // forced, unchanged
	if got, want := b.String(), "1s a\nline 1\n4s b\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// Live (a terminal): the block is redrawn in place, not redrawn when unchanged,
// erased before a permanent line and by Clear.
func TestLiveDisplay(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	d := progress.NewDisplay(&b, true, time.Hour)
	d.Status([]string{"x", "y"}, "", "", false)
	first := b.String()
	d.Status([]string{"x", "y"}, "", "", false)
	if b.String() != first {
		t.Fatalf("an unchanged block was redrawn: %q", b.String())
	}
	d.Status([]string{"x", "z"}, "", "", false)
	if !strings.HasSuffix(b.String(), "\x1b[2A\r\x1b[2Kx\n\r\x1b[2Kz\n") {
		t.Fatalf("not redrawn in place: %q", b.String())
	}
	d.Linef("event")
	if !strings.HasSuffix(b.String(), "\x1b[2A\x1b[2K\n\x1b[2K\n\x1b[2Aevent\n") {
		t.Fatalf("the block was not erased before the line: %q", b.String())
	}
	d.Status([]string{"x", "z"}, "", "", false)
	if !strings.HasSuffix(b.String(), "event\n\r\x1b[2Kx\n\r\x1b[2Kz\n") {
		t.Fatalf("the block is not drawn again under the line: %q", b.String())
	}
}

// Lines: at most PerSecond a second, the rest counted in one line when there is room.
func TestLinesBoundTheRate(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	var got []string
	l := progress.Lines{PerSecond: 2, Print: func(s string) { got = append(got, s) }, Now: func() time.Time { return now }}
	for _, s := range []string{"a", "b", "c", "d", "e"} {
		l.Add(s)
	}
	l.Flush()
	if strings.Join(got, "|") != "a|b" || l.Skipped() != 3 {
		t.Fatalf("first flush printed %q, %d skipped", got, l.Skipped())
	}
	now = now.Add(time.Second)
	l.Add("f")
	l.Flush()
	if strings.Join(got, "|") != "a|b|… 3 more (ymirflow history ISSUE, or the console, has them all)|f" || l.Skipped() != 0 {
		t.Fatalf("a second later printed %q, %d skipped", got, l.Skipped())
	}
}
