package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkStart runs the built binary once per iteration, as an operator does: its
// whole cost, from exec to exit, of a command that touches no server (`version`, `history
// --help`). It also reports init-ms, the package initialisation the runtime times
// (GODEBUG=inittrace=1): what every command pays before main runs.
//
//	go test -run '^$' -bench Start -benchtime 50x ./cmd/ymirflow/
func BenchmarkStart(b *testing.B) {
	bin := buildBinary(b)
	for _, args := range [][]string{{"version"}, {"history", "--help"}} {
		b.Run(strings.Join(args, "_"), func(b *testing.B) {
			var took time.Duration
			for b.Loop() {
				start := time.Now()
				if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
					b.Fatalf("%v: %v\n%s", args, err, out)
				}
				took += time.Since(start)
			}
			b.ReportMetric(float64(took.Microseconds())/1000/float64(b.N), "ms/start")
		})
	}
	b.Run("init", func(b *testing.B) {
		var total float64
		for b.Loop() {
			cmd := exec.Command(bin, "version")
			cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				b.Fatalf("version: %v\n%s", err, stderr.Bytes())
			}
			total += initMS(stderr.String())
		}
		b.ReportMetric(total/float64(b.N), "init-ms")
	})
}

// initMS sums the clock times of an inittrace: lines "init PKG @T ms, D ms clock, ...".
func initMS(trace string) float64 {
	var sum float64
	for _, line := range strings.Split(trace, "\n") {
		f := strings.Fields(line)
		if len(f) >= 7 && f[0] == "init" && f[6] == "clock," {
			if d, err := strconv.ParseFloat(f[4], 64); err == nil {
				sum += d
			}
		}
	}
	return sum
}
