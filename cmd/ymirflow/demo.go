package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/cmd/ymirflow/internal/demo"
	"github.com/ymirflow/ymirflow/pipeline"
)

const demoHelp = `
Runs the whole pipeline once, in one process, and checks it: an embedded Redis
(miniredis; REDIS_URL for a real one, in a fresh namespace), a fake Jira with sample
issues that exercise every path, a fetcher sweep, deliberate duplicates, two workers
per stage with simulated agents, a second sweep, and a summary whose checks must all
pass (exit 1 otherwise). Ctrl-C stops it cleanly. For a pipeline that keeps running
until Ctrl-C, see ymirflow dev.
`

// runDemo runs the whole pipeline in one process (cmd/ymirflow/internal/demo): `ymirflow demo
// [--issues N] [--speed S] [--seed N] [--json] [--keep]`. Ctrl-C stops it cleanly (exit
// 0, with a line saying so).
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config.Demo
	fs, err := parseCmd("demo", &cfg, args, stdout)
	if err != nil {
		return err
	}
	if len(fs.Args()) > 0 {
		return usagef("unexpected arguments %q", fs.Args())
	}
	agentDur, err := cfg.AgentDuration()
	if err != nil {
		return usagef("SPEED (--speed) %v", err)
	}
	if agentDur == 0 {
		agentDur = -1 // instant
	}
	ns, err := demoNamespace(fs, &cfg)
	if err != nil {
		return err
	}
	logOut, logName, closeLog, err := demoLogFile(&cfg, stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	log, err := pipeline.NewLogger(logOut, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return usagef("LOG_LEVEL: %v", err)
	}
	redis.SetLogger(goRedisLogger{log})

	progress := stdout
	if cfg.JSON {
		progress = stderr
	}
	keep := cfg.Keep
	var onPhase func(string, *demo.Summary)
	var console *demoConsole
	if cfg.Web != "" {
		// The console shows the run live, then keeps showing its streams until Ctrl-C.
		console, err = startDemoConsole(cfg.Web, log)
		if err != nil {
			return err
		}
		defer console.Close()
		console.intro(progress)
		keep = true
		onPhase = func(phase string, s *demo.Summary) {
			if phase != demo.PhaseSweep {
				return
			}
			url := cfg.RedisURL
			if s.Embedded {
				url = s.Redis // no password
			}
			if err := console.attach(ctx, url, s.Namespace); err != nil {
				log.Error().Err(err).Msg("console: cannot read the demo's Redis")
			}
		}
	}
	sum, err := demo.Run(ctx, demo.Options{RedisURL: cfg.RedisURL, Namespace: ns, Issues: cfg.Issues, Seed: cfg.Seed,
		AgentDuration: agentDur, Keep: keep, Out: stdout, JSON: cfg.JSON, Progress: progress,
		Live: demoIsTerminal(progress), Logger: log, LogFile: logName, OnPhase: onPhase})
	if console != nil && err == nil && ctx.Err() == nil {
		// A real Redis: Run has returned; the embedded one served until Ctrl-C already.
		console.intro(progress)
		fmt.Fprintln(progress, "The console keeps serving until Ctrl-C.")
		<-ctx.Done()
	}
	switch {
	case errors.Is(err, demo.ErrInterrupted):
		return nil // the demo said so; Ctrl-C is a clean way out
	case err != nil:
		return err
	case !sum.Complete():
		return errors.New("the demo's checks failed (see the summary)")
	}
	return nil
}

// demoNamespace is the demo's namespace: a fresh one ("") on a Redis of the caller's
// unless --ymir-namespace names one; a Redis Cluster is refused.
func demoNamespace(fs *flag.FlagSet, cfg *config.Demo) (string, error) {
	namespaceGiven := false
	fs.Visit(func(f *flag.Flag) { namespaceGiven = namespaceGiven || f.Name == "ymir-namespace" })
	ns := cfg.Namespace
	if cfg.RedisURL != "" && !namespaceGiven {
		ns = "" // a fresh one
	}
	if cfg.RedisURL != "" {
		opts, err := pipeline.ClientOptions(cfg.RedisURL)
		if err != nil {
			return "", usagef("%v", err)
		}
		if opts.IsClusterMode {
			return "", usagef("REDIS_URL (--redis-url) names a Redis Cluster; the demo needs a standalone Redis")
		}
	}
	return ns, nil
}

// demoLogFile opens the demo's log as LOG_FILE says: "-" is stderr, "" a new temporary
// file. It returns the writer, the file's name to show ("" for stderr) and its close.
func demoLogFile(cfg *config.Demo, stderr io.Writer) (io.Writer, string, func(), error) {
	switch cfg.LogFile {
	case "-":
		return stderr, "", func() {}, nil
	case "":
		f, err := os.CreateTemp("", "ymirflow-demo-*.log")
		if err != nil {
			return nil, "", nil, fmt.Errorf("create the log file: %w", err)
		}
		return f, f.Name(), func() { _ = f.Close() }, nil
	}
	f, err := os.OpenFile(cfg.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", nil, usagef("LOG_FILE (--log-file) %v", err)
	}
	return f, cfg.LogFile, func() { _ = f.Close() }, nil
}

// demoIsTerminal reports whether w is a terminal (live counters) rather than a pipe or file
// (plain progress lines).
func demoIsTerminal(w io.Writer) bool {
	for {
		u, ok := w.(interface{ Unwrap() io.Writer })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb"
}
