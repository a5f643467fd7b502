package main

// Shared by the inspection commands (pending, locks, streams, history, replay, dlq):
// argument parsing with flags anywhere, help text, aligned tables, JSON, human
// durations, confirmation prompts and the Inspector's construction.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// loadCmd parses a command's settings and returns its positional arguments. Flags may
// come before, between or after the positional arguments (`history RHEL-1 --json`).
// -h/--help prints the usage line, the description and the settings to stdout and
// returns flag.ErrHelp; a mistake on the command line is a usage error that carries the
// usage line (and, for an unknown flag, the nearest one).
func loadCmd(name string, c config.Command, args []string, stdout io.Writer) ([]string, error) {
	fs, err := parseCmd(name, c, args, stdout)
	if err != nil {
		return nil, err
	}
	return fs.Args(), nil
}

// parseCmd is loadCmd returning the FlagSet, to tell which settings were given.
func parseCmd(name string, c config.Command, args []string, stdout io.Writer) (*flag.FlagSet, error) {
	cmd, _ := commandNamed(name)
	scratch := flag.NewFlagSet(name, flag.ContinueOnError)
	c.Register(scratch)
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		n := strings.TrimLeft(a, "-")
		if n == "h" || n == "help" {
			writeHelp(stdout, cmd, scratch)
			return nil, flag.ErrHelp
		}
		flags = append(flags, a)
		if strings.Contains(n, "=") {
			continue
		}
		f := scratch.Lookup(n)
		if f == nil {
			continue // the real parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 == len(args) {
			// Without this, the "--" below would become the flag's value.
			return nil, usagef("flag needs an argument: --%s\nUsage: ymirflow %s", f.Name, cmd.usage)
		}
		i++
		flags = append(flags, args[i])
	}
	fs, err := load(name, c, append(append(flags, "--"), pos...))
	switch {
	case errors.Is(err, flag.ErrHelp):
		writeHelp(stdout, cmd, scratch)
		return nil, err
	case err != nil && len(config.SettingErrors(err)) == 0:
		// The command line itself is wrong (an unknown flag, a flag without its value):
		// say how the command is used, not every setting it has.
		return nil, usagef("%v\nUsage: ymirflow %s\n`ymirflow help %s` lists every flag.", errors.Unwrap(err), cmd.usage, name)
	case err != nil:
		return nil, err
	}
	return fs, nil
}

// writeHelp prints a command's help: usage line, description, settings.
func writeHelp(w io.Writer, cmd command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: ymirflow %s\n\n%s\n\n", cmd.usage, strings.TrimSpace(cmd.help))
	fmt.Fprintln(w, "Flags, with the environment variable that sets each (the flag wins) or \"(flag only)\":")
	config.WriteUsage(w, fs)
	fmt.Fprintf(w, "\nEach setting in full: docs/configuration.md, \"ymirflow %s\".\n", cmd.name)
}

// inspector connects to Redis and returns the Inspector of the configured pipeline,
// with the workers' lease scope.
func inspector(ctx context.Context, c *config.Common, stderr io.Writer) (*env, *inspect.Inspector, error) {
	e, err := connect(ctx, c, stderr)
	if err != nil {
		return nil, nil, err
	}
	// The same lease keys as `ymirflow worker` (scope of the namespace, default format).
	locker, err := e.newLocker(lease.Options{})
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	in, err := inspect.New(inspect.Config{Client: e.rdb, Topology: e.topology, Locker: locker, MaxLen: c.MaxLen,
		MaxEventBytes: c.MaxEventBytes})
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	return e, in, nil
}

// inputErr turns errors that come from what the operator typed (an invalid issue key,
// a malformed stream id) into usage errors (exit 2).
func inputErr(err error) error {
	var bad *inspect.BadKeyError
	switch {
	case errors.As(err, &bad):
		return usageError{err}
	case errors.Is(err, lease.ErrInvalidKey):
		return usagef("an issue key given is invalid: %s", inspect.KeyForm)
	}
	return inputKeyErr(err, "")
}

// inputKeyErr is inputErr where the operator typed the issue key key: an invalid one is
// said in a plain sentence with an example, not with the lease library's pattern.
func inputKeyErr(err error, key string) error {
	switch {
	case errors.Is(err, lease.ErrInvalidKey):
		return badKey(key)
	case errors.Is(err, inspect.ErrBadID):
		return usageError{err}
	}
	return err
}

// badKey is the usage error for key, which is not an issue key: the console's words
// (inspect.BadKey).
func badKey(key string) error { return usageError{errors.New(inspect.BadKey(key))} }

// noteFilters says on stderr, under an empty result, what was looked at: the filters in
// force (name, value pairs; empty values are not in force) and the pipeline read. An
// empty view must never leave the operator guessing whether a filter hid everything.
func noteFilters(stderr io.Writer, c *config.Common, pairs ...string) {
	var on []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			on = append(on, fmt.Sprintf("--%s %s", pairs[i], pairs[i+1]))
		}
	}
	filters := "no filters"
	if len(on) > 0 {
		filters = "filters in force: " + strings.Join(on, ", ")
	}
	fmt.Fprintf(stderr, "(%s; namespace %s at %s)\n", filters, c.Namespace, c.RedactedRedisURL())
}

// table prints aligned columns. Cells come from stream entries anyone may have written:
// control characters (an ESC[ sequence in a correlation id) never reach the terminal, and
// no cell is wider than maxCell runes.
type table struct {
	tw      *tabwriter.Writer
	maxCell int
}

// Cell widths: a list's columns, and the values of a one-record view (dlq show).
const (
	maxListCell   = 120
	maxRecordCell = 4096
)

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0), maxCell: maxListCell}
	t.row(header...)
	return t
}

// newRecordTable is a FIELD/VALUE table whose values may be long.
func newRecordTable(w io.Writer) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0), maxCell: maxRecordCell}
	t.row("FIELD", "VALUE")
	return t
}

// cell makes s safe for one table cell: tabs and line breaks become spaces, other
// control and bidirectional-override characters a visible \xNN or \uNNNN, and more than
// max runes are cut with "…".
func cell(s string, max int) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n >= max {
			b.WriteString("…")
			break
		}
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\x%02x", r)
		case (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == utf8.RuneError:
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
		n++
	}
	return b.String()
}

// row prints one line; empty cells show as "-".
func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			c = "-"
		}
		c = cell(c, t.maxCell)
		if i > 0 {
			fmt.Fprint(t.tw, "\t")
		}
		fmt.Fprint(t.tw, c)
	}
	fmt.Fprint(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// human prints a duration for people: 350ms, 42s, 1m30s, 2h5m, 3d4h.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + human(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return strconv.Itoa(int(d.Round(time.Second)/time.Second)) + "s"
	case d < time.Hour:
		d = d.Round(time.Second)
		return unit(int(d/time.Minute), "m", int(d%time.Minute/time.Second), "s")
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		return unit(int(d/time.Hour), "h", int(d%time.Hour/time.Minute), "m")
	}
	d = d.Round(time.Hour)
	return unit(int(d/(24*time.Hour)), "d", int(d%(24*time.Hour)/time.Hour), "h")
}

func unit(a int, au string, b int, bu string) string {
	if b == 0 {
		return strconv.Itoa(a) + au
	}
	return strconv.Itoa(a) + au + strconv.Itoa(b) + bu
}

// ttl prints a lease's time left ("?" when unknown).
func ttl(d time.Duration) string {
	if d <= 0 {
		return "?"
	}
	return human(d)
}

// stamp prints a time in UTC to the second.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// stdin returns the reader confirmations are read from and whether a person is at it
// (a terminal). Tests replace it.
var stdin = func() (io.Reader, bool) {
	return os.Stdin, term.IsTerminal(int(os.Stdin.Fd()))
}

// errDeclined: the operator answered no.
var errDeclined = errors.New("not confirmed; nothing done")

// confirm asks question on stderr and reads y/N from stdin, unless yes. Without a
// terminal on stdin and without --yes it refuses (usage error): a script must say
// --yes.
func confirm(stderr io.Writer, yes bool, question string) error {
	if yes {
		return nil
	}
	in, interactive := stdin()
	if !interactive {
		return usagef("stdin is not a terminal, so nobody can answer %q; pass --yes to go ahead", question)
	}
	fmt.Fprintf(stderr, "%s [y/N] ", question)
	line, _ := bufio.NewReader(in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errDeclined
}
