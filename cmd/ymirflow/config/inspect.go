package config

import (
	"flag"
	"regexp"
	"strings"
	"sync"

	"github.com/ymirflow/ymirflow/inspect"
)

// Inspect is the settings of the inspection commands (pending, locks,
// streams, history, replay, dlq).
type Inspect struct {
	Common
	JSON bool // --json (flag only): print JSON instead of a table
}

// Register defines the inspection flags on fs.
func (i *Inspect) Register(fs *flag.FlagSet) {
	i.Common.Register(fs)
	fs.BoolVar(&i.JSON, "json", false, "print JSON instead of a table")
	flagOnly(fs, "json")
}

// Validate checks the inspection settings.
func (i *Inspect) Validate() error { return i.Common.Validate() }

// registerYes defines --yes, a flag only: skipping a confirmation must never come
// from a variable left in the shell.
func registerYes(fs *flag.FlagSet, p *bool, what string) {
	fs.BoolVar(p, "yes", false, "do not ask before "+what)
	flagOnly(fs, "yes")
}

// issueKeyish is a loose check; the lock's canonicalisation has the last word.
// Compiled on first use, not at start-up, where every command of the binary would pay for it.
var issueKeyish = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\S+$`) })

func validateRangeID(p *problems, flagName, v string) {
	if v == "" || inspect.CheckRangeID(v) == nil {
		return
	}
	p.addFlag(flagName, "= %q is not a stream id: MS or MS-SEQ (e.g. 1700000000000-0), - or +, or ( before an id for an exclusive bound", v)
}

func validateIssueFilter(p *problems, v string) {
	if v != "" && !issueKeyish().MatchString(strings.TrimSpace(v)) {
		p.addFlag("issue", "= %s", inspect.BadKey(v)) // the console's words
	}
}
