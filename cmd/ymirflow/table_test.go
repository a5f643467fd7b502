package main

import (
	"bytes"
	"strings"
	"testing"
)

// Table cells never carry control characters to the terminal, and are capped.
func TestTableCellsAreSafe(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tb := newTable(&buf, "ID", "CORRELATION")
	tb.row("1-0", "abc\x1b[2J\x1b]0;pwned\x07\u202edef\r\nnext")
	tb.row("2-0", strings.Repeat("x", 500))
	if err := tb.flush(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, bad := range []string{"\x1b", "\x07", "\u202e", "\r"} {
		if strings.Contains(out, bad) {
			t.Fatalf("control character %q reached the output: %q", bad, out)
		}
	}
	if !strings.Contains(out, `abc\x1b[2J\x1b]0;pwned\x07\u202edef  next`) {
		t.Fatalf("escaped form missing: %q", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[2], strings.Repeat("x", maxListCell)+"…") {
		t.Fatalf("cell not capped at %d: %q", maxListCell, lines[len(lines)-1])
	}
}
