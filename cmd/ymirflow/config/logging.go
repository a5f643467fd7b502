package config

import (
	"flag"
	"strings"
)

// Defaults of the logging settings, which every command has.
const (
	DefaultLogLevel  = "info"
	DefaultLogFormat = "json"
)

// LogLevels are the accepted LOG_LEVEL values (zerolog's level names).
var LogLevels = []string{"trace", "debug", "info", "warn", "error", "fatal", "panic", "disabled"}

// registerLogging defines --log-level and --log-format on fs, bound to level and format.
func registerLogging(fs *flag.FlagSet, level, format *string) {
	fs.StringVar(level, "log-level", DefaultLogLevel, "log level: "+strings.Join(LogLevels, "|"))
	fs.StringVar(format, "log-format", DefaultLogFormat, "log format: json|console")
}

// validateLogging checks a log level and format as registerLogging defines them.
func validateLogging(p *problems, level, format string) {
	if !oneOf(level, LogLevels...) {
		p.add("log-level", "= %q must be one of %s", level, strings.Join(LogLevels, "|"))
	}
	if !oneOf(format, "json", "console") {
		p.add("log-format", "= %q must be json or console", format)
	}
}
