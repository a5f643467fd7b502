package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 36: a CLI command's own start. Every command of the binary runs every package's
// initialisation first, so ours does little there: patterns are compiled and scripts
// joined on first use. The runtime reports what each package's init allocated
// (GODEBUG=inittrace=1); a count, not a time, so a busy machine does not move it.
// Before, three packages allocated 79 to 93 KiB each (the console's and the redactor's
// patterns, the lease's scripts joined with the slots').
func TestStartUpInitAllocatesLittle(t *testing.T) {
	const perPackage, total = 32 << 10, 64 << 10
	sum, seen := 0, 0
	for _, in := range initTrace(t, buildBinary(t)) {
		if !strings.HasPrefix(in.pkg, "github.com/ymirflow/ymirflow") {
			continue
		}
		seen++
		sum += in.bytes
		if in.bytes > perPackage {
			t.Errorf("%s allocates %d bytes in its initialisation, over %d: do that work on first use", in.pkg, in.bytes, perPackage)
		}
	}
	if seen == 0 {
		t.Fatal("no init line of this module in the trace")
	}
	if sum > total {
		t.Errorf("this module's packages allocate %d bytes in their initialisation, over %d", sum, total)
	}
}

// The binary leaves out two dependencies whose package initialisation every command
// paid before main, though few commands use them:
//   - gRPC: spans go over OTLP/HTTP only, through a transport of internal/tracing,
//     because the SDK's HTTP exporter imports gRPC (see otlphttp.go); ≈ 6 ms of each
//     start (29.6 → 23 ms for `version` on the 2-core CI machine).
//   - Prometheus's client: the metrics are internal/metric's own series; client_golang's
//     default registry (the Go and process collectors, procfs) and the protobuf runtime
//     it shares with OTLP's generated types (below): both out, `version` 22.9 → 18.9 ms
//     (means of 12 alternating `perf stat -r 20` runs; Prometheus alone, 0.6 ms), and
//     VictoriaMetrics/metrics, tried next, ≈ 0.3 ms more (it reads cgroup files and
//     builds runtime/metrics' tables at initialisation).
//   - protobuf: the OTLP request is written by internal/tracing (otlpencode.go), not by
//     the SDK's otlptrace and the generated OTLP types, whose descriptors registered at
//     start.
func TestBinaryLeavesGRPCAndPrometheusOut(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, left := range []string{"google.golang.org/grpc", "github.com/prometheus/client_golang", "google.golang.org/protobuf",
			"github.com/VictoriaMetrics/metrics", "runtime/metrics"} {
			if pkg == left || strings.HasPrefix(pkg, left+"/") {
				t.Fatalf("the binary imports %s: find what pulls it in with `go mod why %s`", pkg, pkg)
			}
		}
	}
}

// BenchmarkStart runs the built binary once per iteration, as an operator does: its
// whole cost, from exec to exit, of a command that touches no server (`version`, `history
// --help`). Each iteration also runs a hello-world Go binary built the same way, the
// floor of any Go command on this machine (exec, the runtime's start, exit), so that
// own-ms/start, the command's cost above it, reads the same on a machine whose page
// faults are dear. It also reports init-ms, the package initialisation the runtime
// times (GODEBUG=inittrace=1): what every command pays before main runs.
//
//	go test -run '^$' -bench Start -benchtime 50x ./cmd/ymirflow/
func BenchmarkStart(b *testing.B) {
	bin, floor := buildBinary(b), buildFloor(b)
	run := func(bin string, args ...string) time.Duration {
		start := time.Now()
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v\n%s", bin, args, err, out)
		}
		return time.Since(start)
	}
	for _, args := range [][]string{{"version"}, {"history", "--help"}} {
		b.Run(strings.Join(args, "_"), func(b *testing.B) {
			var took, floorTook time.Duration
			for b.Loop() {
				floorTook += run(floor)
				took += run(bin, args...)
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
			b.ReportMetric(ms(took), "ms/start")
			b.ReportMetric(ms(floorTook), "floor-ms/start")
			b.ReportMetric(ms(took-floorTook), "own-ms/start")
		})
	}
	b.Run("init", func(b *testing.B) {
		var total float64
		for b.Loop() {
			for _, in := range initTrace(b, bin) {
				total += in.ms
			}
		}
		b.ReportMetric(total/float64(b.N), "init-ms")
	})
}

// pkgInit is one line of an inittrace: "init PKG @T ms, D ms clock, B bytes, A allocs".
type pkgInit struct {
	pkg   string
	ms    float64
	bytes int
}

// initTrace runs `bin version` with GODEBUG=inittrace=1 and returns its trace.
func initTrace(t testing.TB, bin string) []pkgInit {
	t.Helper()
	cmd := exec.Command(bin, "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("version: %v\n%s", err, stderr.Bytes())
	}
	var out []pkgInit
	for _, line := range strings.Split(stderr.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "init" || f[6] != "clock," || f[8] != "bytes," {
			continue
		}
		ms, err1 := strconv.ParseFloat(f[4], 64)
		n, err2 := strconv.Atoi(f[7])
		if err1 == nil && err2 == nil {
			out = append(out, pkgInit{pkg: f[1], ms: ms, bytes: n})
		}
	}
	return out
}

// buildFloor builds a Go program that prints one line and exits, as buildBinary builds
// the command (same toolchain, same flags).
func buildFloor(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"os\"\n\nfunc main() { _, _ = os.Stdout.WriteString(\"floor\\n\") }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "floor")
	if out, err := exec.Command("go", "build", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
