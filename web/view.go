package web

import (
	"fmt"
	"html/template"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ymirflow/ymirflow/inspect"
)

func (s *Server) funcs() template.FuncMap {
	return template.FuncMap{
		"dur":  human,
		"ms":   func(d time.Duration) int64 { return d.Milliseconds() },
		"clip": func(v string) string { return s.clip(v, maxErrList) },
		// long is clip for a detail cell that wraps: readable in full up to maxDetail.
		"long": func(v string) string { return s.clip(v, maxDetail) },
		// noworker says that n events wait for a worker (inspect.NoWorker).
		"noworker": inspect.NoWorker,
		// short renders a record's JSON detail as key=value pairs (inspect.ShortDetail).
		"short": inspect.ShortDetail,
		// errclip is clip for a dead letter's error: its start and its end, where an
		// agent's stderr says why it failed.
		"errclip": func(v string) string { return inspect.ErrorBrief(s.clean(v), maxErrList) },
		"stamp":   stamp,
		// traceURL is the trace viewer's link of a trace id ("" without a template or id).
		"traceURL": func(id string) string {
			if s.cfg.TraceURLTemplate == "" || id == "" {
				return ""
			}
			return strings.ReplaceAll(s.cfg.TraceURLTemplate, TraceIDPlaceholder, id)
		},
		"stampMS": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		},
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return human(s.cfg.Now().Sub(t)) + " ago"
		},
		// line is a lease's wait line in words ("3 waiting, oldest 40s"; "" for none).
		"line":     func(l inspect.LeaseInfo) string { return l.Line(s.cfg.Now()) },
		"usd":      func(v float64) string { return fmt.Sprintf("%.4f", v) },
		"issueURL": func(key string) string { return "/issue?key=" + url.QueryEscape(key) },
		"deadURL":  func(id string) string { return "/dead-letters/" + url.PathEscape(id) },
		"releaseURL": func(agent, issue string) string {
			return "/leases/release?" + url.Values{"agent": {agent}, "issue": {issue}}.Encode()
		},
		"idle": func(ms int64) string { return human(time.Duration(ms) * time.Millisecond) },
		"sortedKeys": func(m map[string]string) []string {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			return keys
		},
		"lag": func(n int64) string {
			if n < 0 {
				return "?"
			}
			return strconv.FormatInt(n, 10)
		},
	}
}

// human is a short duration: 850ms, 4.2s, 3m05s, 2h10m.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// chart is the outcomes per minute as stacked SVG bars; every number is computed here,
// the template only places them.
type chart struct {
	// Width and Height are the SVG's; the bars stand on a baseline at Plot, above the
	// time axis and its labels.
	Width, Height, Plot int
	Bars                []bar
	Ticks               []tick
	Legend              []legend
	Max                 int64
	Total               int64
	Empty               bool
}

type bar struct {
	X, Y, W, H int
	Class      string
	Title      string
}

// tick is one mark of the time axis: a bucket's start time (UTC) under its bar, and
// "now" at the right end.
type tick struct {
	X, Y, Mark, TextY int // Y to Mark: the mark's line; TextY: the label's baseline
	Label             string
	Anchor            string // the SVG text-anchor: start, middle or end
}

type legend struct {
	Class, Type string
	Count       int64
}

// classOf gives an event type its colour class; the classes are defined in app.css.
func classOf(t string) string {
	switch t {
	case "stage.done":
		return "c-done"
	case "stage.failed":
		return "c-failed"
	case "lock.dropped":
		return "c-dropped"
	case "lock.coalesced", "lock.delivered", "followup.delivered", "followup.rolled":
		return "c-coalesced"
	}
	return "c-other"
}

func newChart(o inspect.Outcomes) chart {
	c := chart{Width: 600, Plot: 120, Height: 138, Total: o.Total, Empty: o.Total == 0}
	for _, b := range o.Buckets {
		c.Max = max(c.Max, b.Total)
	}
	n := len(o.Buckets)
	if n == 0 || c.Max == 0 {
		return c
	}
	w := c.Width / n
	c.Ticks = axisTicks(o.Buckets, w, c.Plot, c.Height)
	sums := map[string]int64{}
	for i, b := range o.Buckets {
		y := c.Plot
		for _, t := range o.Types {
			v := b.Counts[t]
			if v == 0 {
				continue
			}
			sums[t] += v
			h := int(v * int64(c.Plot) / c.Max)
			if h < 1 {
				h = 1
			}
			y -= h
			c.Bars = append(c.Bars, bar{X: i * w, Y: y, W: max(w-1, 1), H: h, Class: classOf(t),
				Title: fmt.Sprintf("%s: %d %s", b.Start.UTC().Format("15:04"), v, t)})
		}
	}
	for _, t := range o.Types {
		c.Legend = append(c.Legend, legend{Class: classOf(t), Type: t, Count: sums[t]})
	}
	return c
}

// axisTicks labels the time axis: the first bucket's start, then about every sixth of
// the window on whole buckets, and "now" at the end, so a reader sees when each bar was.
func axisTicks(buckets []inspect.OutcomeBucket, w, plot, height int) []tick {
	n := len(buckets)
	step := max(n/6, 1)
	var ticks []tick
	for i := 0; i < n; i += step {
		if i > 0 && n-i < step/2 {
			break // too close to "now" to be read apart from it
		}
		anchor := "middle"
		if i == 0 {
			anchor = "start"
		}
		ticks = append(ticks, tick{X: i * w, Y: plot, Mark: plot + 4, TextY: height - 2,
			Label: buckets[i].Start.UTC().Format("15:04"), Anchor: anchor})
	}
	return append(ticks, tick{X: n * w, Y: plot, Mark: plot + 4, TextY: height - 2, Label: "now", Anchor: "end"})
}
