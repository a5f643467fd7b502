// Command ymirflow runs and inspects the ymirflow pipeline: workers, the Jira fetcher,
// operator commands and a self-contained demo. See `ymirflow help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ymirflow/ymirflow/cmd/ymirflow/config"
	"github.com/ymirflow/ymirflow/internal/redact"
)

// version is stamped at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

// command is one subcommand. run gets the arguments after the command's name; usage
// is its usage line (after "ymirflow "), help what --help says before the settings.
type command struct {
	name    string
	summary string
	usage   string
	help    string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"dev", "a whole local pipeline until Ctrl-C: fake Jira, fetcher, webhook, a worker per stage, console",
			"dev [--exec CMD] [--web-addr A] [--embedded-redis-addr A] [--interval D]", devHelp, runDev},
		{"demo", "run the whole pipeline in one process on an embedded Redis and a fake Jira",
			"demo [--issues N] [--speed S] [--seed N] [--json] [--keep] [--web A]", demoHelp, runDemo},
		{"worker", "run one agent's router (--agent triage|rebase|backport|rebuild [--branch c9s|c10s])",
			"worker --agent triage|rebase|backport|rebuild [--branch c9s|c10s] [--runner exec|demo] [--exec CMD]", workerHelp, runWorker},
		{"fetch", "sweep Jira and publish triage requests (--once or --interval D)",
			"fetch --jira-url URL [--once | --interval D]", fetchHelp, runFetch},
		{"enqueue", "publish requests by hand: enqueue --agent A [--branch B] KEY...",
			"enqueue [--agent A] [--branch B] [--user-triggered] KEY...", enqueueHelp, runEnqueue},
		{"pending", "pending stream entries per group, with the lease guarding each",
			"pending [--agent A] [--branch B] [--issue KEY] [--json]", pendingHelp, runPending},
		{"locks", "live leases; `locks release AGENT KEY` force-releases one",
			"locks [--agent A] [--issue KEY] [--json] | locks release AGENT KEY --reason WHY [--yes]", locksHelp, runLocks},
		{"streams", "length, groups, lag, pending and consumers of every stream",
			"streams [--json]", streamsHelp, runStreams},
		{"history", "every event of one issue across streams, in order: history KEY",
			"history KEY [--json]", historyHelp, runHistory},
		{"cost", "what the agents reported spending, per issue, agent and day: cost [KEY...]",
			"cost [KEY...] [--json]", costHelp, runCost},
		{"budget", "raise an issue's exhausted budget and resume its parked work: budget approve KEY --usd N",
			"budget approve KEY --usd N", budgetHelp, runBudget},
		{"pause", "stop new runs of an agent, issue or field value until resume (events wait in order)",
			"pause SCOPE --reason WHY [--stop-running] | pause --list [--json]", pauseHelp, runPause},
		{"resume", "end a pause: its waiting events run again, in stream order",
			"resume SCOPE --reason WHY [--json]", resumeHelp, runResume},
		{"replay", "re-publish past events through the normal lock path",
			"replay --stream S [--from ID] [--to ID] [--issue KEY] --reason WHY | --dry-run [--yes] [--json]", replayHelp, runReplay},
		{"dlq", "the dead-letter stream: dlq list|show|requeue|purge",
			"dlq list|show ID|requeue ID...|requeue --all|purge [flags] (writes: --reason WHY)", dlqHelp, runDLQ},
		{"audit", "the operators' audit trail: who wrote what, why, when and from where",
			"audit [--who W] [--action A] [--issue KEY] [--since D] [--limit N] [--json]", auditHelp, runAudit},
		{"drain", "workers take no new work, finish what runs, report drained (maintenance, upgrades)",
			"drain (--agent A [--branch B] | --worker NAME | --all) --reason WHY [--wait] [--undo] | drain [--json]", drainHelp, runDrain},
		{"webhook", "receive Jira webhooks and publish triage requests as a sweep would (--addr A)",
			"webhook --jira-url URL --webhook-secret-file F [--addr HOST:PORT]", webhookHelp, runWebhook},
		{"web", "the operator console in a browser, and its JSON API (--addr, default " + config.DefaultWebAddr + ")",
			"web [--addr HOST:PORT] [--read-only]", webHelp, runWeb},
		{"fakejira", "serve the fake Jira for local trials (--webhook URL sends it webhooks)",
			"fakejira [--addr HOST:PORT] [--issues N | --issues-file F] [--webhook URL]", fakejiraHelp, runFakeJira},
	}
}

// commandNamed returns the command called name.
func commandNamed(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

// usageError marks a command-line mistake (exit 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printHelp(stderr)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && args[0] == "help" {
			if _, ok := commandNamed(args[1]); ok {
				return run(ctx, []string{args[1], "--help"}, stdout, stderr)
			}
			fmt.Fprintf(stderr, "ymirflow help: unknown command %q\n\n", args[1])
			printHelp(stderr)
			return exitUsage
		}
		printHelp(stdout)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "ymirflow", version)
		return exitOK
	}
	// Whatever a command prints passes the redactor of ymirflow's own secrets.
	if red := redact.New(environSecrets(os.Getenv)...); red.Len() > 0 {
		stdout, stderr = red.Writer(stdout), red.Writer(stderr)
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		var se *config.SettingError
		var ue usageError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &ue), errors.As(err, &se):
			fmt.Fprintf(stderr, "ymirflow %s: %v\n", c.name, err)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "ymirflow %s: %v\n", c.name, err)
			return exitRuntime
		}
	}
	fmt.Fprintf(stderr, "ymirflow: unknown command %q\n\n", args[0])
	printHelp(stderr)
	return exitUsage
}

func printHelp(w io.Writer) {
	fmt.Fprintf(w, "ymirflow (version %s): AI agents over Jira issues on Redis Streams, one lease per issue and stage.\n\n", version)
	fmt.Fprintln(w, "Usage: ymirflow COMMAND [flags] [args]")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nEvery setting is a flag and an environment variable (the flag wins); the filters and modes")
	fmt.Fprintln(w, "of one invocation (--agent, --issue, --json, --yes, ...) of an operator command are flags only.")
	fmt.Fprintln(w, "`ymirflow help COMMAND` (or COMMAND --help) lists them with their defaults.")
	fmt.Fprintln(w, "Exit codes: 0 ok, 1 runtime error, 2 usage error.")
}

// load parses a command's settings (flags given before any argument). A --help request
// ends the command with flag.ErrHelp (exit 0); a bad setting is a usage error (exit 2).
// Nothing is printed: loadCmd prints the help and the usage line.
func load(name string, c config.Command, args []string) (*flag.FlagSet, error) {
	fs, err := config.LoadTo(io.Discard, "ymirflow "+name, c, args)
	if errors.Is(err, flag.ErrHelp) {
		return fs, err
	}
	if err != nil {
		return fs, usageError{err}
	}
	return fs, nil
}
