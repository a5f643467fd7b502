package progress

import (
	"fmt"
	"time"
)

// Lines bounds how many event lines reach the screen: at most PerSecond in any one
// second (a burst of a second's worth, then one every 1/PerSecond). Lines over the
// bound are counted, not shown, and the count is reported in one line at the next
// Flush that has room, so a sweep that publishes hundreds of events prints a few lines
// and "… 97 more", not a scroll nobody can read. It is not safe for concurrent use.
type Lines struct {
	PerSecond int
	// Print shows one line.
	Print func(line string)
	// Now is the clock (nil: time.Now); tests set it.
	Now func() time.Time

	queue   []string
	tokens  float64
	last    time.Time
	skipped int
}

// Add queues a line for the next Flush.
func (l *Lines) Add(line string) { l.queue = append(l.queue, line) }

func (l *Lines) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Flush prints the queued lines the bound allows and counts the rest as skipped; a
// count of skipped lines is printed first, when there is room for it.
func (l *Lines) Flush() {
	per := float64(max(l.PerSecond, 1))
	now := l.now()
	if l.last.IsZero() {
		l.tokens = per
	} else {
		l.tokens = min(per, l.tokens+now.Sub(l.last).Seconds()*per)
	}
	l.last = now
	if l.skipped > 0 && l.tokens >= 1 {
		l.tokens--
		l.Print(fmt.Sprintf("… %d more (ymirflow history ISSUE, or the console, has them all)", l.skipped))
		l.skipped = 0
	}
	for _, line := range l.queue {
		if l.tokens < 1 {
			l.skipped++
			continue
		}
		l.tokens--
		l.Print(line)
	}
	l.queue = l.queue[:0]
}

// Skipped is the number of lines counted but not shown yet.
func (l *Lines) Skipped() int { return l.skipped }
