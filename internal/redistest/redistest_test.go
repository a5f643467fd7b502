package redistest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ymirflow/ymirflow/internal/redistest"
)

// With the shared Redis down, a package that uses it fails at once with one line naming
// the URL tried and how to start a server: no test or example runs, none hangs (lockmw's
// ExampleNewMiddleware used to block on <-router.Running() until the go test timeout) and
// none panics (inspect's examples indexed an empty result). It runs `go test` on two real
// packages with REDIS_URL on a closed port, so a package that loses its TestMain, or a
// Main that starts retrying, fails here.
func TestUnreachableFailsFast(t *testing.T) {
	// Not parallel: it runs go test in a child process and bounds how fast that fails.
	if testing.Short() {
		t.Skip("builds two test binaries")
	}
	root := redistest.ModuleRoot(t)
	port := redistest.FreePort(t) // free a moment ago: nothing listens there
	url := "redis://127.0.0.1:" + strconv.Itoa(port) + "/15"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args := []string{"test", "-count=1", "-timeout", "60s"}
	if raceEnabled {
		args = append(args, "-race") // reuses the outer run's compiled packages
	}
	args = append(args, "./lockmw/", "./inspect/")
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "REDIS_URL="+url)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		t.Fatalf("go test passed with REDIS_URL=%s:\n%s", url, out.String())
	}
	text := out.String()
	for _, want := range []string{url, "redis-server --daemonize yes --save '' --port " + strconv.Itoa(port), "make redis"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	// Per package: the hint once, then go test's FAIL line with the binary's run time.
	fail := regexp.MustCompile(`(?m)^FAIL\s+github.com/ymirflow/ymirflow/(\S+)\s+([0-9.]+)s$`)
	got := fail.FindAllStringSubmatch(text, -1)
	if len(got) != 2 {
		t.Fatalf("want a FAIL line for lockmw and inspect, got %q:\n%s", got, text)
	}
	for _, m := range got {
		secs, _ := strconv.ParseFloat(m[2], 64)
		if secs > 5 {
			t.Errorf("%s took %.1fs to fail; want seconds", m[1], secs)
		}
	}
	if n := strings.Count(text, "redistest: cannot reach Redis"); n != 2 {
		t.Errorf("hint printed %d times, want once per package:\n%s", n, text)
	}
	var noise []string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if !strings.HasPrefix(line, "redistest: ") && !strings.HasPrefix(line, "FAIL") {
			noise = append(noise, line)
		}
	}
	if len(noise) > 0 {
		t.Errorf("lines besides the hint and FAIL:\n%s", strings.Join(noise, "\n"))
	}
}

// Issue 35: a test that blanks REDIS_URL (to keep the caller's settings out) still gets
// the server the run was started with, not DefaultURL's.
func TestURLIsTheGivenServerAfterBlanking(t *testing.T) {
	if os.Getenv("REDISTEST_CHILD") == "1" {
		t.Setenv("REDIS_URL", "")
		fmt.Println("URL=" + redistest.URL())
		return
	}
	given := "redis://127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) + "/3"
	cmd := exec.Command(os.Args[0], "-test.run=^TestURLIsTheGivenServerAfterBlanking$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1", "REDIS_URL="+given)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "URL="+given+"\n") {
		t.Fatalf("with REDIS_URL=%s given and then blanked, URL() said:\n%s", given, out)
	}
}

// The hint names the port REDIS_URL names, and never a password.
func TestReachableHint(t *testing.T) {
	// Not parallel: it sets REDIS_URL (t.Setenv), which Go refuses in a parallel test.
	port := redistest.FreePort(t)
	t.Setenv("REDIS_URL", "redis://u:s3cret@127.0.0.1:"+strconv.Itoa(port)+"/3")
	err := redistest.Reachable()
	if err == nil {
		t.Fatal("Reachable: nil on a closed port")
	}
	msg := err.Error()
	if strings.Contains(msg, "s3cret") || !strings.Contains(msg, "--port "+strconv.Itoa(port)) ||
		!strings.Contains(msg, "127.0.0.1:"+strconv.Itoa(port)+"/3") || strings.Contains(msg, "\n") {
		t.Errorf("hint %q", msg)
	}
	if h := redistest.StartHint("127.0.0.1:6379"); !strings.Contains(h, "make redis") {
		t.Errorf("StartHint(6379) = %q", h)
	}
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}
