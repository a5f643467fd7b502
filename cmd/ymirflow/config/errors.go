package config

import (
	"errors"
	"fmt"
)

// SettingError is one invalid setting. Its message names the environment
// variable and the flag, e.g.
// "MAX_IDLE_TIME (--max-idle-time) = 1m must exceed the lease heartbeat interval LOCK_TTL/3 = 1m40s".
type SettingError struct {
	Env  string // environment variable, e.g. MAX_IDLE_TIME; "" for a flag only
	Flag string // flag name without dashes, e.g. max-idle-time
	Msg  string // what is wrong, starting with the value where useful
}

func (e *SettingError) Error() string {
	if e.Env == "" {
		return fmt.Sprintf("--%s %s", e.Flag, e.Msg) // a flag only: no variable to name
	}
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

// addFlag is add for a flag that no environment variable sets.
func (p *problems) addFlag(flagName, format string, args ...any) {
	*p = append(*p, &SettingError{Flag: flagName, Msg: fmt.Sprintf(format, args...)})
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
