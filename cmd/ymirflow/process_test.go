package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// buildBinary builds `ymirflow` into a temp dir of t and returns its path: the tests
// that need real processes (separate pids, signals) run it.
func buildBinary(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ymirflow")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is a ymirflow process started by a test, its output collected line by line.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string // stdout lines
	errs []string // stderr lines
	done chan struct{}
	err  error
}

// startProc starts bin with args and exactly env (nothing leaks from the test's own
// environment); it is killed when the test ends, if still running.
func startProc(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	collect := func(r io.Reader, into *[]string) {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			*into = append(*into, sc.Text())
			p.mu.Unlock()
		}
	}
	wg.Add(2)
	go collect(stdout, &p.out)
	go collect(stderr, &p.errs)
	go func() {
		wg.Wait() // the pipes are read to their end before Wait closes them
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stdout and stderr return what the process printed so far.
func (p *proc) stdout() string { p.mu.Lock(); defer p.mu.Unlock(); return strings.Join(p.out, "\n") }
func (p *proc) stderr() string { p.mu.Lock(); defer p.mu.Unlock(); return strings.Join(p.errs, "\n") }

// logTails is the last n lines of each log file in dir, for a failure's message.
func logTails(dir string, n int) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "== %s\n%s\n", filepath.Base(f), tail(string(data), n))
	}
	return b.String()
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitLine polls the process's stdout or stderr (errs) until a line satisfies match, and
// returns it; it fails the test at the deadline or if the process exits first.
func (p *proc) waitLine(errs bool, within time.Duration, match func(string) bool) string {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		p.mu.Lock()
		lines := p.out
		if errs {
			lines = p.errs
		}
		for _, l := range lines {
			if match(l) {
				p.mu.Unlock()
				return l
			}
		}
		p.mu.Unlock()
		select {
		case <-p.done:
			p.t.Fatalf("%v exited (%v) before the line looked for\nstdout:\n%s\nstderr:\n%s", p.cmd.Args[1:], p.err, p.stdout(), p.stderr())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%v: no such line after %v\nstdout:\n%s\nstderr:\n%s", p.cmd.Args[1:], within, p.stdout(), p.stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exit waits at most within for the process to end and returns its exit code.
func (p *proc) exit(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		p.t.Fatalf("%v: still running %v later\nstderr:\n%s", p.cmd.Args[1:], within, p.stderr())
	}
	return p.cmd.ProcessState.ExitCode()
}

// stop sends SIGINT (Ctrl-C) and returns the exit code and how long the process took.
func (p *proc) stop(within time.Duration) (int, time.Duration) {
	p.t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		p.t.Fatal(err)
	}
	code := p.exit(within)
	return code, time.Since(start)
}

// Issue 29, done when: two workers started with default settings on one machine both
// run, as two consumers with two metrics ports; a third given the name of a live one
// refuses to start, saying what to set.
func TestTwoDefaultWorkersShareAMachine(t *testing.T) {
	bin := buildBinary(t)
	_, ns := redistest.Client(t)
	env := []string{"REDIS_URL=" + redistest.URL(), "YMIR_NAMESPACE=" + ns + "ymir", "BLOCK_TIME=200ms", "LOG_LEVEL=info"}
	type start struct {
		Consumer string `json:"consumer"`
		Metrics  string `json:"metrics_addr"`
	}
	var starts []start
	var workers []*proc
	for range 2 {
		w := startProc(t, bin, env, "worker", "--agent", "triage", "--runner", "demo")
		line := w.waitLine(true, 30*time.Second, func(l string) bool { return strings.Contains(l, `"worker starting"`) })
		var s start
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		starts = append(starts, s)
		workers = append(workers, w)
	}
	if starts[0].Consumer == starts[1].Consumer || starts[0].Metrics == starts[1].Metrics ||
		!strings.HasPrefix(starts[0].Metrics, "127.0.0.1:") {
		t.Fatalf("two default workers: %+v", starts)
	}
	for i, w := range workers {
		// "worker starting" comes before the router runs: poll, as a probe would.
		redistest.Eventually(t, 30*time.Second, func() bool { return ready(w.stderr()) },
			"worker %d (%s) does not serve /readyz", i, starts[i].Consumer)
	}

	third := startProc(t, bin, env, "worker", "--agent", "triage", "--runner", "demo", "--consumer-name", starts[0].Consumer)
	if code := third.exit(10 * time.Second); code != exitUsage {
		t.Fatalf("a worker under a live worker's name: exit %d\n%s", code, third.stderr())
	}
	if msg := third.stderr(); !strings.Contains(msg, "CONSUMER_NAME") || !strings.Contains(msg, "is taken") {
		t.Errorf("a worker under a live worker's name says:\n%s", msg)
	}
	for _, w := range workers {
		if code, took := w.stop(10 * time.Second); code != 0 {
			t.Errorf("worker: exit %d after SIGINT (%v)\n%s", code, took, w.stderr())
		}
	}
	// Stopped cleanly, a worker frees its name at once: a restart under it starts.
	again := startProc(t, bin, env, "worker", "--agent", "triage", "--runner", "demo", "--consumer-name", starts[0].Consumer)
	again.waitLine(true, 30*time.Second, func(l string) bool { return strings.Contains(l, `"worker starting"`) })
	if code, _ := again.stop(10 * time.Second); code != 0 {
		t.Errorf("restarted worker: exit %d\n%s", code, again.stderr())
	}
}

// Issue 29, done when: `ymirflow dev` brings up the whole pipeline with the console, and
// locks, pending and history from another terminal show it; Ctrl-C stops it, exit 0.
func TestDevRunsAPipelineUntilCtrlC(t *testing.T) {
	bin := buildBinary(t)
	port := func() string { return "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) }
	redisAddr := port()
	start := time.Now()
	logDir := t.TempDir()
	dev := startProc(t, bin, []string{"LOG_LEVEL=info"}, "dev", "--embedded-redis-addr", redisAddr, "--web-addr", port(),
		"--fakejira-addr", port(), "--webhook-addr", port(), "--demo-duration", "1s", "--log-dir", logDir)
	line := dev.waitLine(false, 30*time.Second, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "console ") })
	up := time.Since(start)
	f := strings.Fields(line) // console URL token T
	if len(f) != 4 || f[2] != "token" || len(f[3]) < 16 {
		t.Fatalf("console line %q", line)
	}
	consoleURL := f[1]
	t.Logf("FIGURE dev: console up %v after the start", up.Round(time.Millisecond))
	export := dev.waitLine(false, time.Second, func(l string) bool { return strings.Contains(l, "export REDIS_URL=") })
	if !strings.Contains(export, "REDIS_URL=redis://"+redisAddr+"/0") {
		t.Fatalf("the commands to try do not name the embedded Redis %s: %q", redisAddr, export)
	}

	// The console answers, and a write needs the printed token.
	resp, err := http.Get(consoleURL + "api/v1/overview")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("console %s: %v %v", consoleURL, resp, err)
	}
	resp.Body.Close()

	// Another terminal: the operator commands against the printed REDIS_URL.
	other := []string{"REDIS_URL=redis://" + redisAddr + "/0", "YMIR_NAMESPACE=ymir", "AGENT=triage"}
	cmd := func(args ...string) string {
		t.Helper()
		p := startProc(t, bin, other, args...)
		if code := p.exit(20 * time.Second); code != 0 {
			t.Fatalf("ymirflow %v: exit %d\n%s", args, code, p.stderr())
		}
		return p.stdout()
	}
	// RHEL-1001 is the first sample issue, fresh: the first sweep triages it, and its
	// rebase or backport or rebuild follows.
	deadline := time.Now().Add(30 * time.Second)
	var hist string
	for {
		hist = cmd("history", "RHEL-1001")
		if strings.Contains(hist, "stage.done") && strings.Count(hist, "stage.done") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history RHEL-1001 after 30s:\n%s", hist)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := cmd("pending", "--json"); !strings.Contains(out, `"group": "triage"`) || !strings.Contains(out, `"group": "rebase-c9s"`) {
		t.Fatalf("pending shows no worker's group:\n%s", out)
	}
	// A lease shows while a run (0.5 to 1.5 s) is on; enqueue one to be sure there is one,
	// and another every 2 s: on a loaded machine one CLI call can outlast a short run.
	cmd("enqueue", "RHEL-1001")
	deadline = time.Now().Add(20 * time.Second)
	for next := time.Now().Add(2 * time.Second); ; {
		if time.Now().After(next) {
			cmd("enqueue", "RHEL-1001")
			next = time.Now().Add(2 * time.Second)
		}
		out := cmd("locks", "--json")
		if strings.Contains(out, `"owner": "dev-`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("locks never showed a dev worker's lease:\n%s\nhistory RHEL-1001:\n%s\ndev's last lines:\n%s\n%s",
				out, cmd("history", "RHEL-1001"), tail(dev.stderr(), 20), logTails(logDir, 15))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Issue 35: dev runs until Ctrl-C, not until its longest internal timeout (the stop
	// budget, the start-up waits, 30s each). It stays up past all of them, the console
	// answering and a worker still taking new work at the end.
	keepUp := devStopBudget + 35*time.Second
	for time.Since(start) < keepUp {
		select {
		case <-dev.done:
			t.Fatalf("dev ended by itself %v after the start (%v)\nstdout:\n%s\nstderr:\n%s",
				time.Since(start).Round(time.Second), dev.err, dev.stdout(), dev.stderr())
		case <-time.After(2 * time.Second):
		}
		resp, err := http.Get(consoleURL + "api/v1/overview")
		if err != nil {
			t.Fatalf("console %v after the start: %v", time.Since(start).Round(time.Second), err)
		}
		resp.Body.Close()
	}
	before := strings.Count(cmd("history", "RHEL-1002"), "\n")
	cmd("enqueue", "RHEL-1002")
	redistest.Eventually(t, 30*time.Second, func() bool {
		return strings.Count(cmd("history", "RHEL-1002"), "\n") > before
	}, "a worker of dev took no new work %v after the start", keepUp)

	code, took := dev.stop(20 * time.Second)
	if code != 0 || !strings.Contains(dev.stdout(), "stopped") {
		t.Fatalf("dev after SIGINT: exit %d after %v\nstdout:\n%s\nstderr:\n%s", code, took, dev.stdout(), dev.stderr())
	}
	t.Logf("FIGURE dev: exit 0 %v after SIGINT", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("dev took %v to stop (bound 10s)", took)
	}
}

// Issue 35: the two ways a second `dev` fails say what a dev user did, not what a worker's
// operator would: REDIS_URL still naming an earlier dev's embedded Redis, and a dev
// already running on the namespace (dev names its workers; nobody set CONSUMER_NAME).
func TestDevSecondStartSaysWhy(t *testing.T) {
	bin := buildBinary(t)
	port := func() string { return "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) }
	ports := func() []string {
		return []string{"--web-addr", port(), "--fakejira-addr", port(), "--webhook-addr", port(), "--log-dir", t.TempDir()}
	}

	gone := port()
	stale := startProc(t, bin, []string{"REDIS_URL=redis://" + gone + "/0"}, append([]string{"dev", "--embedded-redis-addr", gone}, ports()...)...)
	if code := stale.exit(20 * time.Second); code != exitUsage {
		t.Fatalf("dev with REDIS_URL at a stopped embedded Redis: exit %d\n%s", code, stale.stderr())
	}
	if msg := stale.stderr(); !strings.Contains(msg, "embedded Redis of an earlier `ymirflow dev`") || !strings.Contains(msg, "unset REDIS_URL") {
		t.Errorf("dev with REDIS_URL at a stopped embedded Redis says:\n%s", msg)
	}

	_, ns := redistest.Client(t)
	env := []string{"REDIS_URL=" + redistest.URL(), "YMIR_NAMESPACE=" + ns + "ymir"}
	first := startProc(t, bin, env, append([]string{"dev", "--demo-duration", "300ms"}, ports()...)...)
	first.waitLine(false, 60*time.Second, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "console ") })
	second := startProc(t, bin, env, append([]string{"dev", "--demo-duration", "300ms"}, ports()...)...)
	if code := second.exit(30 * time.Second); code != exitUsage {
		t.Fatalf("a second dev on one namespace: exit %d\n%s", code, second.stderr())
	}
	if msg := second.stderr(); !strings.Contains(msg, "another `ymirflow dev` runs on namespace "+ns+"ymir") ||
		!strings.Contains(msg, "--ymir-namespace") || strings.Contains(msg, "CONSUMER_NAME") {
		t.Errorf("a second dev on one namespace says:\n%s", msg)
	}
	if code, _ := first.stop(20 * time.Second); code != 0 {
		t.Errorf("the first dev: exit %d after SIGINT\n%s", code, first.stderr())
	}
}
