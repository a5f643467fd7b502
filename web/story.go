package web

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/audit"
)

// story is an issue's timeline drawn as Temporal's web UI draws a workflow's: one lane
// per agent and branch, each run a bar from its start to its terminal record labelled
// with its fence and outcome, every other event a marker on its lane, on a real time
// axis. Every coordinate is computed here; the template only places them.
type story struct {
	Width, Height int
	Left          int // the lanes' labels are left of it
	Lanes         []lane
	Runs          []runBar
	Marks         []mark
	Ticks         []tick
	AxisY         int
	Span          string // the time the axis covers, said plainly
}

type lane struct {
	Label string
	Y, H  int // the lane's band
	Mid   int
}

// runBar is one run: from the time its entry was queued (or the lane's previous run
// ended, whichever is later: the lease is not recorded when it is taken) to its
// terminal record.
type runBar struct {
	X, Y, W, H int
	Class      string // done or failed
	Label      string
	LabelX     int
	LabelY     int
	LabelIn    bool // the label fits inside the bar, else it is above it
	Title      string
}

// mark is one event that is not a run's end: a request queued, a busy decision, a
// follow-up, an operator's action, a dead letter.
type mark struct {
	X, Y   int
	Kind   string // queued, dropped, coalesced, waited, delayed, delivered, superseded, followup, operator, dead, other
	Glyph  string // the shape's path, around (X, Y)
	Label  string // a short word under the marker, at LabelY
	LabelY int
	Title  string
}

const (
	storyWidth  = 1100
	storyLeft   = 150
	storyRight  = 24
	laneH       = 80
	storyTop    = 8
	storyAxisH  = 26
	markerSize  = 6
	minBarWidth = 3
)

// markKind names an event's marker, or "" for a run's terminal record.
func markKind(ev inspect.HistoryEvent) string {
	switch {
	case ev.Kind == inspect.KindAudit:
		return "operator"
	case ev.Kind == inspect.KindDead:
		return "dead"
	case ev.EventType == event.StageDone || ev.EventType == event.StageFailed:
		return ""
	case ev.EventType == event.CommentCreated || strings.HasPrefix(ev.EventType, "followup."):
		return "followup"
	case ev.Kind == inspect.KindInput:
		return "queued"
	case strings.HasPrefix(ev.EventType, "lock."):
		return strings.TrimPrefix(ev.EventType, "lock.")
	}
	return "other"
}

// laneOf names an event's lane: its agent and the branch of the stream it is about.
func (s *Server) laneOf(ev inspect.HistoryEvent) string {
	stream := ev.Stream
	if ev.Kind != inspect.KindInput {
		stream, _, _ = strings.Cut(ev.About, " ")
	}
	if ev.Kind == inspect.KindAudit {
		stream = ""
		if _, rest, ok := strings.Cut(ev.Detail, "stream="); ok {
			stream, _, _ = strings.Cut(rest, " ")
		}
	}
	agent, branch := ev.Agent, ""
	if r, ok := s.cfg.Topology.RouteOf(stream); ok {
		agent, branch = r.Agent, r.Branch
	}
	switch {
	case agent == "" && ev.Kind == inspect.KindAudit:
		return "operators"
	case agent == "":
		return "other"
	case branch == "":
		return agent
	}
	return agent + " " + branch
}

// newStory draws events (oldest first).
func (s *Server) newStory(events []inspect.HistoryEvent) story {
	st := story{Width: storyWidth, Left: storyLeft}
	if len(events) == 0 {
		return st
	}
	var names []string
	laneIdx := map[string]int{}
	for _, ev := range events {
		n := s.laneOf(ev)
		if _, ok := laneIdx[n]; !ok {
			laneIdx[n] = len(names)
			names = append(names, n)
		}
	}
	for i, n := range names {
		y := storyTop + i*laneH
		st.Lanes = append(st.Lanes, lane{Label: n, Y: y, H: laneH, Mid: y + laneH/2})
	}
	st.AxisY = storyTop + len(names)*laneH
	st.Height = st.AxisY + storyAxisH
	t0, t1 := events[0].Time, events[len(events)-1].Time
	span := t1.Sub(t0)
	if span < time.Second {
		span = time.Second
	}
	// A margin on both sides, so the first and last markers are not cut.
	pad := span / 20
	t0, t1 = t0.Add(-pad), t1.Add(pad)
	plot := float64(storyWidth - storyLeft - storyRight)
	x := func(t time.Time) int { return storyLeft + int(plot*float64(t.Sub(t0))/float64(t1.Sub(t0))) }
	st.Ticks = storyTicks(t0, t1, x, st.AxisY)
	st.Span = fmt.Sprintf("%s to %s UTC (%s)", events[0].Time.UTC().Format("15:04:05.000"),
		events[len(events)-1].Time.UTC().Format("15:04:05.000"), human(events[len(events)-1].Time.Sub(events[0].Time)))

	queuedAt := map[string]time.Time{} // "stream id" of an input entry: when it was queued
	lastEnd := map[string]time.Time{}  // a lane's last run's end
	ended := map[string]string{}       // an operator's write: how it ended, by its started record
	for _, ev := range events {
		if ref, ok := strings.CutPrefix(ev.About, "audit "); ok && ev.Kind == inspect.KindAudit {
			ended[ref] = ev.Reason
		}
	}
	for _, ev := range events {
		ln := st.Lanes[laneIdx[s.laneOf(ev)]]
		k := markKind(ev)
		if k == "operator" && strings.HasPrefix(ev.About, "audit ") {
			continue // the end of a write: one marker per write, at its start
		}
		if ev.Kind == inspect.KindInput {
			queuedAt[ev.Stream+" "+ev.ID] = ev.Time
		}
		if k == "" {
			st.Runs = append(st.Runs, s.runBar(ev, ln, queuedAt, lastEnd, x))
			continue
		}
		m := s.mark(ev, k, ln, x)
		if e := ended[ev.ID]; k == "operator" && e != "" && e != audit.OutcomeDone {
			m.Label += " " + e
		}
		st.Marks = append(st.Marks, m)
	}
	spreadLabels(st.Marks)
	return st
}

func (s *Server) runBar(ev inspect.HistoryEvent, ln lane, queuedAt, lastEnd map[string]time.Time, x func(time.Time) int) runBar {
	start, ok := queuedAt[ev.About]
	if !ok {
		start = ev.Time
	}
	if prev, ok := lastEnd[ln.Label]; ok && prev.After(start) {
		start = prev
	}
	lastEnd[ln.Label] = ev.Time
	outcome := "done"
	if ev.EventType == event.StageFailed {
		outcome = "failed"
	}
	b := runBar{X: x(start), Y: ln.Y + 22, H: 18, Class: outcome}
	b.W = max(x(ev.Time)-b.X, minBarWidth)
	b.Label = outcome
	if ev.Fence != "" {
		b.Label = "fence " + ev.Fence + " · " + outcome
	}
	// 11px text is about 6.5px a character; a label that does not fit inside the bar
	// goes above it (not after it, where the lane's next run may start), clear of the
	// queued marker at the bar's start.
	b.LabelIn = len(b.Label)*13/2+8 <= b.W
	b.LabelX, b.LabelY = b.X+4, b.Y+13
	if !b.LabelIn {
		b.LabelX, b.LabelY = b.X+10, b.Y-5
	}
	b.Title = fmt.Sprintf("run of entry %s, fence %s: %s at %s after %s (its start is when its entry was queued or the lane's previous run ended: the lease is not recorded when taken)\n%s",
		or(ev.About, "?"), or(ev.Fence, "?"), outcome, ev.Time.UTC().Format("15:04:05.000"), human(ev.Time.Sub(start)), s.clip(inspect.ShortDetail(ev.Detail), 300))
	return b
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func (s *Server) mark(ev inspect.HistoryEvent, kind string, ln lane, x func(time.Time) int) mark {
	m := mark{X: x(ev.Time), Y: ln.Y + 54, Kind: kind, Label: kind}
	switch kind {
	case "queued": // on the bar's row, pointing down at where its run's bar starts
		m.Y, m.Label = ln.Y+15, ""
	case "operator":
		m.Label = strings.TrimPrefix(ev.EventType, inspect.EventOperatorPrefix)
		if ev.Reason != audit.OutcomeStarted {
			m.Label += " " + ev.Reason // refused; a failed end is added by newStory
		}
	case "followup":
		m.Label = "follow-up"
	case "dead":
		m.Label = "dead letter"
	}
	m.Glyph = glyph(kind, m.X, m.Y)
	m.Title = fmt.Sprintf("%s %s on %s (%s %s)", ev.Time.UTC().Format("15:04:05.000"), ev.EventType, ln.Label, ev.Stream, ev.ID)
	if ev.Reason != "" {
		m.Title += ": " + ev.Reason
	}
	if ev.Detail != "" {
		m.Title += "\n" + s.clip(inspect.ShortDetail(ev.Detail), 300)
	}
	return m
}

// glyph is a marker's shape around (x, y): a kind is told by its shape and colour.
func glyph(kind string, x, y int) string {
	r := markerSize
	switch kind {
	case "queued": // a small triangle pointing down: something arrived
		return fmt.Sprintf("M%d %d L%d %d L%d %d Z", x-r+1, y-r+1, x+r-1, y-r+1, x, y+r-2)
	case "operator": // a flag
		return fmt.Sprintf("M%d %d L%d %d L%d %d L%d %d L%d %d Z", x, y+r, x, y-r-2, x+r+3, y-r+1, x+1, y, x+1, y+r)
	case "followup": // a diamond
		return fmt.Sprintf("M%d %d L%d %d L%d %d L%d %d Z", x, y-r-1, x+r+1, y, x, y+r+1, x-r-1, y)
	case "dead", "dropped", "superseded": // a cross
		return fmt.Sprintf("M%d %d L%d %d M%d %d L%d %d", x-r, y-r, x+r, y+r, x-r, y+r, x+r, y-r)
	}
	return fmt.Sprintf("M%d %d a%d %d 0 1 0 %d 0 a%d %d 0 1 0 %d 0", x-r+1, y, r-1, r-1, 2*(r-1), r-1, r-1, -2*(r-1)) // a dot
}

// spreadLabels puts a marker's label a line lower when it would overlap the label
// before it on the same lane, and clips long ones.
func spreadLabels(ms []mark) {
	lastX, lastLow := map[int]int{}, map[int]bool{}
	for i := range ms {
		m := &ms[i]
		m.Label = clipLabel(m.Label)
		m.LabelY = m.Y + 16
		if m.Label == "" {
			continue
		}
		if px, ok := lastX[m.Y]; ok && m.X-px < 80 && !lastLow[m.Y] {
			m.LabelY += 10
			lastLow[m.Y] = true
		} else {
			lastLow[m.Y] = false
		}
		lastX[m.Y] = m.X
	}
}

func clipLabel(s string) string {
	if len(s) > 22 {
		return s[:21] + "…"
	}
	return s
}

// storyTicks marks the axis at round times, about eight of them.
func storyTicks(t0, t1 time.Time, x func(time.Time) int, y int) []tick {
	steps := []time.Duration{time.Millisecond * 100, time.Millisecond * 250, time.Millisecond * 500, time.Second, 2 * time.Second,
		5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
		10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}
	span := t1.Sub(t0)
	i := slices.IndexFunc(steps, func(d time.Duration) bool { return span/d <= 8 })
	if i < 0 {
		i = len(steps) - 1
	}
	step := steps[i]
	format := "15:04:05"
	if step < time.Second {
		format = "15:04:05.000"
	} else if step >= time.Minute {
		format = "15:04"
	}
	var out []tick
	for t := t0.Truncate(step).Add(step); t.Before(t1); t = t.Add(step) {
		out = append(out, tick{X: x(t), Y: storyTop, Mark: y + 4, TextY: y + 18, Label: t.UTC().Format(format), Anchor: "middle"})
	}
	return out
}
