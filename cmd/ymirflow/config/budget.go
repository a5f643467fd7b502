package config

import "flag"

// Budget is the settings of `ymirflow budget approve`.
type Budget struct {
	Common
	Writer
	USD float64 // --usd (flag only): how much to add to the budget
	// Once names the approval (flag only): a repeat of one name adds nothing. Default:
	// the command's own, unique per call.
	Once string
}

// Register defines the flags on fs.
func (b *Budget) Register(fs *flag.FlagSet) {
	b.Common.Register(fs)
	b.Writer.register(fs)
	fs.Float64Var(&b.USD, "usd", 0, "USD added to the issue's budget and to each of its agents' (above 0, at most 10000)")
	fs.StringVar(&b.Once, "once", "", "names the approval (e.g. jira-comment-10042): given twice, it adds once. Unset: every call adds")
	flagOnly(fs, "usd")
	flagOnly(fs, "once")
}

// Validate checks the settings.
func (b *Budget) Validate() error {
	var p problems
	b.Common.validate(&p)
	if b.USD <= 0 || b.USD > 10_000 {
		p.addFlag("usd", "= %g must be above 0 and at most 10000", b.USD)
	}
	return p.err()
}
