package config

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Usage returns a function suitable for fs.Usage that prints, for each flag,
// its name, type, meaning, default and environment variable.
func Usage(fs *flag.FlagSet) func() {
	return func() {
		w := fs.Output()
		if fs.Name() == "" {
			fmt.Fprintf(w, "Usage:\n")
		} else {
			fmt.Fprintf(w, "Usage of %s:\n", fs.Name())
		}
		WriteUsage(w, fs)
	}
}

// WriteUsage writes one line per flag of fs to w: flag and type, environment
// variable ("flag only" for a filter or mode of one invocation), "required" where
// it is, meaning, and default (when not the zero value).
func WriteUsage(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		plain := *f // UnquoteUsage names the type from the concrete Value
		if s, ok := f.Value.(*setting); ok {
			plain.Value = s.Value
		}
		typ, usage := flag.UnquoteUsage(&plain)
		name := "--" + f.Name
		if typ != "" {
			name += " " + typ
		}
		if req := Required(f); req != "" {
			usage = "[" + req + "] " + usage
		}
		if def := defaultString(f); def != "" {
			usage += " (default " + def + ")"
		}
		env := "(flag only)"
		if e := EnvName(f); e != "" {
			env = "$" + e
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", name, env, usage)
	})
	_ = tw.Flush()
}

func defaultString(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return ""
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			if d, err := time.ParseDuration(f.DefValue); err == nil {
				return fmtDur(d)
			}
		case string:
			return strconv.Quote(f.DefValue)
		}
	}
	return f.DefValue
}

// fmtDur prints a duration without trailing zero units: 1m rather than 1m0s,
// 6h rather than 6h0m0s.
func fmtDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
