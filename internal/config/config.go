// Package config holds the settings of every ymirflow command: one struct per
// command, filled from flags and environment variables, and validated at
// start-up with messages that name the setting.
//
// Every setting is a flag and an environment variable. The environment
// variable's name is the flag's name uppercased with '-' replaced by '_'
// (--lock-ttl is LOCK_TTL, --ymir-namespace is YMIR_NAMESPACE), except where a
// flag says otherwise: --exec is read from RUNNER_EXEC. A flag given on the
// command line wins over the environment. An environment variable set to the
// empty string counts as unset, except for a setting whose --help gives the empty
// value a meaning ("empty: anyone", "empty: off"): there it means that, as
// --flag ” does. Durations are Go durations (300s, 5m, 200ms).
//
// A command uses it in three steps, which [Load] does in one call:
//
//	var w config.Worker
//	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
//	w.Register(fs)          // flags with their defaults
//	fs.Usage = config.Usage(fs)
//	err := config.Parse(fs, args) // command line, then environment
//	err = w.Validate()      // every problem, each naming ENV and --flag
//
// [EnvNames] lists every environment variable that some command reads, derived
// from the structs themselves (see [Commands]), so the deployment manifests can
// be checked against the binary.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3"
)

// Command is the settings of one command.
type Command interface {
	// Register defines the command's flags, with their defaults, on fs and
	// binds them to the struct's fields.
	Register(fs *flag.FlagSet)
	// Validate checks the settings after parsing. It returns every problem
	// found, joined; each is a *SettingError.
	Validate() error
}

// Commands returns a fresh, zero settings struct for every command of the
// binary, keyed by command name. It is the single list that [EnvNames] walks;
// a command added to the CLI must be added here too.
func Commands() map[string]Command {
	return map[string]Command{
		"demo":     &Demo{},
		"worker":   &Worker{},
		"fetch":    &Fetch{},
		"enqueue":  &Enqueue{},
		"pending":  &Pending{},
		"locks":    &Locks{},
		"streams":  &Inspect{},
		"history":  &Inspect{},
		"replay":   &Replay{},
		"dlq":      &DLQ{},
		"fakejira": &FakeJira{},
		"webhook":  &Webhook{},
		"web":      &Web{},
	}
}

// Load is the usual entry point: it registers c's flags on a new FlagSet
// named name (errors are returned, not fatal), sets its Usage to [Usage],
// parses args and the environment with [Parse], then validates c. The FlagSet
// is returned so that the caller can read its positional arguments
// (fs.Args()). A --help request returns an error that wraps flag.ErrHelp.
func Load(name string, c Command, args []string) (*flag.FlagSet, error) {
	return LoadTo(nil, name, c, args)
}

// LoadTo is Load with the usage and parse errors written to w (nil: standard error).
func LoadTo(w io.Writer, name string, c Command, args []string) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if w != nil {
		fs.SetOutput(w)
	}
	c.Register(fs)
	fs.Usage = Usage(fs)
	if err := Parse(fs, args); err != nil {
		return fs, err
	}
	return fs, c.Validate()
}

// Parse sets the flags of fs from the command line args first, then every
// flag that the command line did not set from its environment variable (see
// [EnvName]), using github.com/peterbourgon/ff/v3. A value that does not parse
// yields a *SettingError naming both the variable and the flag.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := ff.Parse(fs, args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	// ff derives the variable name from the flag name. To honour names that
	// differ (--exec ⇔ RUNNER_EXEC), hand ff a shadow FlagSet whose flags are
	// named after their variables and forward every Set to the real flag.
	env := flag.NewFlagSet(fs.Name()+" environment", flag.ContinueOnError)
	env.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		if !given[f.Name] {
			env.Var(forwarder{fs: fs, f: f}, EnvName(f), f.Usage)
		}
	})
	if err := ff.Parse(env, nil, ff.WithEnvVars()); err != nil {
		var se *SettingError
		if errors.As(err, &se) {
			return se
		}
		return err
	}
	// ff skips variables set to the empty string; where --help says what the empty
	// value means, the empty variable means it too.
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(EnvName(f)); ok && v == "" && !given[f.Name] && EmptyMeaningful(f) && err == nil {
			err = forwarder{fs: fs, f: f}.Set("")
		}
	})
	return err
}

// EmptyMeaningful reports whether f's --help gives the empty value a meaning
// ("(empty: anyone)"), so that an environment variable set to "" is applied.
func EmptyMeaningful(f *flag.Flag) bool { return strings.Contains(f.Usage, "empty:") }

// forwarder is a flag.Value that sets another FlagSet's flag, so that the
// real FlagSet records it as set (fs.Visit sees it).
type forwarder struct {
	fs *flag.FlagSet
	f  *flag.Flag
}

func (v forwarder) String() string {
	if v.f == nil {
		return ""
	}
	return v.f.Value.String()
}

func (v forwarder) Set(s string) error {
	if err := v.fs.Set(v.f.Name, s); err != nil {
		return &SettingError{Env: EnvName(v.f), Flag: v.f.Name,
			Msg: fmt.Sprintf("= %q: %v", s, unwrapFlagErr(err))}
	}
	return nil
}

// unwrapFlagErr turns the flag package's "invalid value ... : parse error"
// into the innermost message.
func unwrapFlagErr(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// envNamer is implemented by flag values whose environment variable is not
// the one derived from the flag name.
type envNamer interface{ EnvName() string }

// withEnv wraps v so that its flag is read from the environment variable env.
type withEnv struct {
	flag.Value
	env string
}

func (v withEnv) EnvName() string { return v.env }

func (v withEnv) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return v.Value.String()
}

func (v withEnv) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// stringVarEnv defines a string flag read from an environment variable whose
// name is not derived from the flag's.
func stringVarEnv(fs *flag.FlagSet, p *string, name, env, value, usage string) {
	fs.StringVar(p, name, value, usage)
	f := fs.Lookup(name)
	f.Value = withEnv{Value: f.Value, env: env}
}

// EnvName returns the environment variable that sets flag f: the flag's name
// uppercased with '-' and '.' replaced by '_', unless the flag names another.
func EnvName(f *flag.Flag) string {
	if n, ok := f.Value.(envNamer); ok {
		return n.EnvName()
	}
	return envNameOf(f.Name)
}

func envNameOf(flagName string) string {
	return strings.NewReplacer("-", "_", ".", "_", "/", "_").Replace(strings.ToUpper(flagName))
}

// EnvNames returns every environment variable that the binary reads, each
// with the sorted names of the commands that read it. It registers every
// struct of [Commands] into a throwaway FlagSet, so it never drifts from the
// flags themselves.
func EnvNames() map[string][]string {
	out := map[string][]string{}
	for name, c := range Commands() {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		c.Register(fs)
		fs.VisitAll(func(f *flag.Flag) {
			env := EnvName(f)
			out[env] = append(out[env], name)
		})
	}
	for _, cmds := range out {
		sort.Strings(cmds)
	}
	return out
}

// EnvNamesOf returns the environment variables that the command name reads
// (nil for an unknown command).
func EnvNamesOf(name string) []string {
	c, ok := Commands()[name]
	if !ok {
		return nil
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c.Register(fs)
	var out []string
	fs.VisitAll(func(f *flag.Flag) { out = append(out, EnvName(f)) })
	sort.Strings(out)
	return out
}

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
// variable, meaning, and default (when not the zero value).
func WriteUsage(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		plain := *f // UnquoteUsage names the type from the concrete Value
		if we, ok := f.Value.(withEnv); ok {
			plain.Value = we.Value
		}
		typ, usage := flag.UnquoteUsage(&plain)
		name := "--" + f.Name
		if typ != "" {
			name += " " + typ
		}
		if def := defaultString(f); def != "" {
			usage += " (default " + def + ")"
		}
		fmt.Fprintf(tw, "  %s\t$%s\t%s\n", name, EnvName(f), usage)
	})
	tw.Flush()
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

// SettingError is one invalid setting. Its message names the environment
// variable and the flag, e.g.
// "MAX_IDLE_TIME (--max-idle-time) = 1m must exceed the lease heartbeat interval LOCK_TTL/3 = 1m40s".
type SettingError struct {
	Env  string // environment variable, e.g. MAX_IDLE_TIME
	Flag string // flag name without dashes, e.g. max-idle-time
	Msg  string // what is wrong, starting with the value where useful
}

func (e *SettingError) Error() string {
	return fmt.Sprintf("%s (--%s) %s", e.Env, e.Flag, e.Msg)
}

// SettingErrors returns every *SettingError inside err (as joined by
// Validate), in order.
func SettingErrors(err error) []*SettingError {
	var out []*SettingError
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if se, ok := e.(*SettingError); ok { //nolint:errorlint // the walk unwraps the tree itself, node by node
			out = append(out, se)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		walk(errors.Unwrap(e))
	}
	walk(err)
	return out
}

// problems collects setting errors during validation.
type problems []error

func (p *problems) add(flagName, format string, args ...any) {
	*p = append(*p, &SettingError{Env: envNameOf(flagName), Flag: flagName, Msg: fmt.Sprintf(format, args...)})
}

// addEnv is add for a flag whose variable is not derived from its name.
func (p *problems) addEnv(flagName, env, format string, args ...any) {
	*p = append(*p, &SettingError{Env: env, Flag: flagName, Msg: fmt.Sprintf(format, args...)})
}

func (p problems) err() error { return errors.Join(p...) }

func oneOf(v string, allowed ...string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
