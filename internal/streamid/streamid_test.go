package streamid_test

import (
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/streamid"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in       string
		want     streamid.ID
		ok, full bool
	}{
		{"1700000000000-7", streamid.ID{MS: 1700000000000, Seq: 7}, true, true},
		{"0-0", streamid.ID{}, true, true},
		{"1700000000000", streamid.ID{MS: 1700000000000}, true, false},
		{"18446744073709551615-18446744073709551615", streamid.ID{MS: 1<<64 - 1, Seq: 1<<64 - 1}, true, true},
		{"", streamid.ID{}, false, false},
		{"-", streamid.ID{}, false, false},
		{"+", streamid.ID{}, false, false},
		{"12-", streamid.ID{}, false, false},
		{"-3", streamid.ID{}, false, false},
		{"12-x", streamid.ID{}, false, false},
		{"a-1", streamid.ID{}, false, false},
		{"18446744073709551616-0", streamid.ID{}, false, false},
	} {
		got, ok := streamid.Parse(c.in)
		if ok != c.ok || got != c.want {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
		_, full := streamid.ParseFull(c.in)
		if full != c.full {
			t.Errorf("ParseFull(%q) ok = %v; want %v", c.in, full, c.full)
		}
		if c.full && got.String() != c.in {
			t.Errorf("Parse(%q).String() = %q", c.in, got.String())
		}
	}
}

func TestCompare(t *testing.T) {
	t.Parallel()
	// Numeric, not lexical: "9-0" is before "10-0", "1-9" before "1-10".
	ordered := []string{"not-an-id", "0-1", "1-9", "1-10", "9-0", "10", "10-1", "1700000000000-0"}
	for i := range ordered {
		for j := range ordered {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := streamid.Compare(ordered[i], ordered[j]); got != want {
				t.Errorf("Compare(%q, %q) = %d; want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
	a, _ := streamid.Parse("5-2")
	if !a.Next().After(a) || a.Next().String() != "5-3" {
		t.Errorf("Next of 5-2 = %v", a.Next())
	}
	if a.After(a) {
		t.Error("an id is after itself")
	}
}

func TestTime(t *testing.T) {
	t.Parallel()
	if got, want := streamid.Time("1700000000123-4"), time.UnixMilli(1700000000123); !got.Equal(want) {
		t.Errorf("Time = %v; want %v", got, want)
	}
	if got := streamid.Time("soon"); !got.IsZero() {
		t.Errorf("Time of a non-id = %v; want zero", got)
	}
}
