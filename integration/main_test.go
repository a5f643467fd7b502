package integration

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

var (
	long = flag.Bool("long", false, "run the long forms of the scenarios: 200 issues, 2 workers per "+
		"downstream agent and branch, longer kill and fault phases")
	soak = flag.Duration("soak", 0, "run the SIGKILL scenario for this long (bounded by maxSoak); 0: its "+
		"short or -long duration")
	keep = flag.Bool("keep", false, "keep each scenario's directory (logs, ledger, Redis) and print its path")
)

// maxSoak bounds -soak: the test must end well within `go test -timeout`.
const maxSoak = 2 * time.Hour

// binary is the ymirflow binary, built once by TestMain.
var binary string

// runnerScript is the exec runner every worker runs (absolute path), with runnerShell:
// bash when there is one (its clock needs no fork: a runner told to stop under load
// writes its end line well within the kill grace), else sh.
var runnerScript, runnerShell = "", "sh"

// No test here calls t.Parallel: each scenario runs several ymirflow processes and its
// own redis-server, kills and restarts them, and checks recovery times against their
// bounds; two at once on a two-core CI machine would each miss them.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(envHelper) != "" {
		// A helper process (see helperMain): no build, no servers.
		os.Exit(m.Run())
	}
	os.Exit(mainWithBinary(m))
}

func mainWithBinary(m *testing.M) int {
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Fprintln(os.Stderr, "integration: redis-server not found on PATH; install it with `apt-get install -y redis-server`")
		return 1
	}
	// The scenarios start their own servers, but a suite run with the shared test Redis
	// down is a machine not set up for the suite: say so at once, as every other package
	// does, rather than after minutes of scenarios (`go test ./...` fails in seconds).
	if err := redistest.Reachable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "ymirflow-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binary = filepath.Join(dir, "ymirflow")
	start := time.Now()
	// A plain build (no -race): the workers are the system under test, the race detector
	// runs in the test process, and the 2-core budget is shared with up to 15 processes.
	cmd := exec.Command(goTool(), "build", "-o", binary, "github.com/ymirflow/ymirflow/cmd/ymirflow")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: go build ./cmd/ymirflow:", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "integration: built %s in %s\n", binary, time.Since(start).Round(time.Millisecond))
	}
	if _, err := exec.LookPath("bash"); err == nil {
		runnerShell = "bash"
	}
	runnerScript, err = filepath.Abs(filepath.Join("testdata", "ledger-runner.sh"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	return m.Run()
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	// go test puts GOROOT/bin first on the PATH of the tests it runs (Go 1.19), so
	// this is reached only when the tests run some other way.
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	return "go"
}
