package main

import (
	"context"
	"io"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/inspect"
	"github.com/ymirflow/ymirflow/internal/jira"
)

// operator is the preamble that the commands working on a pipeline's Redis share
// (pending, locks, streams, history, replay, dlq, web, enqueue, fetch, webhook,
// worker), written once in the manner of River's rivercli command base: load the
// settings, check the positional arguments (and what else can be refused before Redis is
// dialled), connect to Redis and open what the command works with, hand it to the
// command's own work, and close it after. Each command states only its settings, its
// check and its work.
type operator struct {
	name     string
	settings config.Command // filled by the load
	common   *config.Common // the settings' Redis part
	// inspect opens the inspector too; jira, when set, builds the Jira client from it
	// (a bad Jira setting is a usage error). At most one of them.
	inspect bool
	jira    *config.Jira
	// check runs after the load and before Redis is dialled, with the positional
	// arguments in s.pos: what it refuses never needs Redis. It may replace s.stderr
	// (the worker redacts it). nil takes no positional arguments.
	check func(s *session) error
	work  func(ctx context.Context, s *session) error
}

// session is what a command's work gets: its output and positional arguments, the
// logger and the Redis client (env), and the inspector or the Jira client it asked for.
type session struct {
	*env
	in             *inspect.Inspector // operator.inspect
	jira           *jira.Client       // operator.jira
	pos            []string
	stdout, stderr io.Writer
}

// run is the command: flag.ErrHelp after --help (exit 0), a usage error for a bad
// setting or argument (exit 2), else what the work returns; Redis is closed after it.
func (o operator) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	pos, err := loadCmd(o.name, o.settings, args, stdout)
	if err != nil {
		return err
	}
	s := &session{pos: pos, stdout: stdout, stderr: stderr}
	check := o.check
	if check == nil {
		check = noArgs("")
	}
	if err := check(s); err != nil {
		return err
	}
	switch {
	case o.inspect:
		s.env, s.in, err = inspector(ctx, o.common, s.stderr)
	case o.jira != nil:
		s.env, s.jira, err = connectJira(ctx, o.common, o.jira, s.stderr)
	default:
		s.env, err = connect(ctx, o.common, s.stderr)
	}
	if err != nil {
		return err
	}
	defer s.Close()
	return o.work(ctx, s)
}

// noArgs is a check that refuses positional arguments; hint, when not empty, says in
// parentheses where they belong.
func noArgs(hint string) func(s *session) error {
	return func(s *session) error {
		switch {
		case len(s.pos) == 0:
			return nil
		case hint == "":
			return usagef("unexpected arguments %q", s.pos)
		default:
			return usagef("unexpected arguments %q (%s)", s.pos, hint)
		}
	}
}
