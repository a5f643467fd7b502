package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"
)

// Parse sets the flags of fs from the command line args first, then every
// flag that the command line did not set from its environment variable (see
// [EnvName]), using github.com/peterbourgon/ff/v3. A value that does not parse
// yields a *SettingError naming the variable and the flag and giving a valid
// example; an undefined flag an *UnknownFlagError naming the nearest one.
func Parse(fs *flag.FlagSet, args []string) error {
	rec := instrument(fs)
	if err := ff.Parse(fs, args); err != nil {
		if rec.err != nil {
			return rec.err
		}
		return flagError(fs, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	// ff derives the variable name from the flag name. To honour names that
	// differ (--exec ⇔ RUNNER_EXEC), hand ff a shadow FlagSet whose flags are
	// named after their variables and forward every Set to the real flag.
	env := flag.NewFlagSet(fs.Name()+" environment", flag.ContinueOnError)
	env.SetOutput(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		if !given[f.Name] && EnvName(f) != "" {
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
// A flag without a variable has none to apply.
func EmptyMeaningful(f *flag.Flag) bool {
	return EnvName(f) != "" && strings.Contains(f.Usage, "empty:")
}

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
		var se *SettingError
		if errors.As(err, &se) {
			return se
		}
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

// setting wraps a flag's Value with what the flag package has no room for: the
// environment variable when it is not derived from the flag's name (or that there is
// none), whether --help marks the setting required, and where a value that does not
// parse is reported (the flag package keeps only its text).
type setting struct {
	flag.Value
	name     string
	env      string       // "": derived from the flag's name
	flagOnly bool         // no environment variable: a per-invocation filter or mode
	required string       // non-empty: --help marks the setting required, and says when
	rec      *parseRecord // set by Parse
}

// parseRecord keeps the first value of a Parse that did not parse.
type parseRecord struct{ err *SettingError }

// settingOf returns f's setting, wrapping its Value on first use.
func settingOf(f *flag.Flag) *setting {
	if s, ok := f.Value.(*setting); ok {
		return s
	}
	s := &setting{Value: f.Value, name: f.Name}
	f.Value = s
	return s
}

// instrument wraps every flag of fs so that a value that does not parse is recorded.
func instrument(fs *flag.FlagSet) *parseRecord {
	rec := &parseRecord{}
	fs.VisitAll(func(f *flag.Flag) { settingOf(f).rec = rec })
	return rec
}

func (v *setting) Set(s string) error {
	err := v.Value.Set(s)
	if err == nil {
		return nil
	}
	env := v.env
	if env == "" && !v.flagOnly {
		env = envNameOf(v.name)
	}
	se := &SettingError{Env: env, Flag: v.name, Msg: fmt.Sprintf("= %q %s", s, valueHint(v.Value, err))}
	if v.rec != nil && v.rec.err == nil {
		v.rec.err = se
	}
	return se
}

// valueHint says what a value of v's type looks like, for a value that did not parse.
func valueHint(v flag.Value, err error) string {
	g, ok := v.(flag.Getter)
	if !ok {
		return "is invalid: " + unwrapFlagErr(err).Error()
	}
	switch g.Get().(type) {
	case time.Duration:
		return "is not a duration: a number with a unit, e.g. 300s, 5m, 1h30m or 200ms"
	case bool:
		return "is not a boolean: true or false (1 and 0 work too)"
	case int, int64, uint, uint64:
		return "is not a whole number, e.g. 3"
	case float64:
		return "is not a number, e.g. 5 or 0.5"
	}
	return "is invalid: " + unwrapFlagErr(err).Error()
}

func (v *setting) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return v.Value.String()
}

func (v *setting) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// stringVarEnv defines a string flag read from an environment variable whose
// name is not derived from the flag's.
func stringVarEnv(fs *flag.FlagSet, p *string, name, env, value, usage string) {
	fs.StringVar(p, name, value, usage)
	settingOf(fs.Lookup(name)).env = env
}

// flagOnly marks flags of fs that no environment variable sets: the filters and modes
// of one invocation of an operator command (--agent, --issue, --json, --yes, ...). A
// variable left in the shell must never change what a view shows or skip a question.
func flagOnly(fs *flag.FlagSet, names ...string) {
	for _, n := range names {
		settingOf(fs.Lookup(n)).flagOnly = true
	}
}

// required marks a flag as required in --help; when says under which condition
// ("" for always). Validate enforces it.
func required(fs *flag.FlagSet, name, when string) {
	if when == "" {
		when = "required"
	}
	settingOf(fs.Lookup(name)).required = when
}

// Required returns what --help says about f being required ("" when it is not).
func Required(f *flag.Flag) string {
	if s, ok := f.Value.(*setting); ok {
		return s.required
	}
	return ""
}

// EnvName returns the environment variable that sets flag f: the flag's name
// uppercased with '-' and '.' replaced by '_', unless the flag names another;
// "" for a flag that only the command line sets.
func EnvName(f *flag.Flag) string {
	if s, ok := f.Value.(*setting); ok {
		switch {
		case s.flagOnly:
			return ""
		case s.env != "":
			return s.env
		}
	}
	return envNameOf(f.Name)
}

func envNameOf(flagName string) string {
	return strings.NewReplacer("-", "_", ".", "_", "/", "_").Replace(strings.ToUpper(flagName))
}

// UnknownFlagError is a flag the command does not define, with the nearest one it does
// ("" when none is close).
type UnknownFlagError struct {
	Flag    string // as given, without dashes
	Nearest string // a defined flag's name, or ""
}

func (e *UnknownFlagError) Error() string {
	if e.Nearest == "" {
		return fmt.Sprintf("unknown flag --%s", e.Flag)
	}
	return fmt.Sprintf("unknown flag --%s (did you mean --%s?)", e.Flag, e.Nearest)
}

// flagError turns the flag package's parse errors (text only) into typed ones where
// the text says which: an undefined flag.
func flagError(fs *flag.FlagSet, err error) error {
	const undefined = "flag provided but not defined: "
	msg := unwrapFlagErr(err).Error()
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if name, ok := strings.CutPrefix(msg, undefined); ok {
		name = strings.TrimLeft(name, "-")
		return &UnknownFlagError{Flag: name, Nearest: nearestFlag(fs, name)}
	}
	return errors.New(strings.Replace(msg, " -", " --", 1))
}

// nearestFlag is the flag of fs closest to name by edit distance, or one it is a
// prefix of; "" when none is close enough to be what was meant.
func nearestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", 0
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(strings.ToLower(name), f.Name)
		if len(name) >= 3 && strings.HasPrefix(f.Name, strings.ToLower(name)) {
			d = min(d, 1)
		}
		if best == "" || d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" || bestD > max(2, len(name)/3) {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, by bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
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
			if env := EnvName(f); env != "" {
				out[env] = append(out[env], name)
			}
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
	fs.VisitAll(func(f *flag.Flag) {
		if env := EnvName(f); env != "" {
			out = append(out, env)
		}
	})
	sort.Strings(out)
	return out
}

// boolVarEnv defines a bool flag read from an environment variable whose name
// is not derived from the flag's.
func boolVarEnv(fs *flag.FlagSet, p *bool, name, env string, value bool, usage string) {
	fs.BoolVar(p, name, value, usage)
	settingOf(fs.Lookup(name)).env = env
}

// durationVarEnv defines a duration flag read from an environment variable whose
// name is not derived from the flag's.
func durationVarEnv(fs *flag.FlagSet, p *time.Duration, name, env string, value time.Duration, usage string) {
	fs.DurationVar(p, name, value, usage)
	settingOf(fs.Lookup(name)).env = env
}
