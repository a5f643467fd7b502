package config

import "flag"

// Pause is the settings of `ymirflow pause` and `ymirflow resume`.
type Pause struct {
	Inspect
	Writer
	// StopRunning (--stop-running, flag only, pause): the runs under way in the scope
	// are stopped (their leases force-released; their events park), not left to finish.
	StopRunning bool
	// List (--list, flag only): list the active pauses instead of writing.
	List bool
}

// Register defines the flags on fs.
func (c *Pause) Register(fs *flag.FlagSet) {
	c.Inspect.Register(fs)
	c.Writer.register(fs)
	fs.BoolVar(&c.StopRunning, "stop-running", false, "pause: also stop the runs under way in the scope (their events park); default: they finish")
	fs.BoolVar(&c.List, "list", false, "list the active pauses, with the events waiting in each")
	flagOnly(fs, "stop-running", "list")
}

// Validate checks the settings.
func (c *Pause) Validate() error { return c.Inspect.Validate() }
