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
	"flag"
	"io"
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
		"dev":      &Dev{},
		"demo":     &Demo{},
		"worker":   &Worker{},
		"fetch":    &Fetch{},
		"enqueue":  &Enqueue{},
		"pending":  &Pending{},
		"locks":    &Locks{},
		"streams":  &Inspect{},
		"history":  &Inspect{},
		"cost":     &Inspect{},
		"budget":   &Budget{},
		"pause":    &Pause{},
		"resume":   &Pause{},
		"replay":   &Replay{},
		"dlq":      &DLQ{},
		"audit":    &Audit{},
		"drain":    &Drain{},
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
