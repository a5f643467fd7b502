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
	Width, Height int
	Bars          []bar
	Legend        []legend
	Max           int64
	Total         int64
	Empty         bool
}

type bar struct {
	X, Y, W, H int
	Class      string
	Title      string
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
	c := chart{Width: 600, Height: 120, Total: o.Total, Empty: o.Total == 0}
	for _, b := range o.Buckets {
		c.Max = max(c.Max, b.Total)
	}
	n := len(o.Buckets)
	if n == 0 || c.Max == 0 {
		return c
	}
	w := c.Width / n
	sums := map[string]int64{}
	for i, b := range o.Buckets {
		y := c.Height
		for _, t := range o.Types {
			v := b.Counts[t]
			if v == 0 {
				continue
			}
			sums[t] += v
			h := int(v * int64(c.Height) / c.Max)
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
