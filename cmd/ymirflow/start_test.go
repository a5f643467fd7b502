package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Issue 36: a CLI command's own start. Every command of the binary runs every package's
// initialisation first, so ours does little there: patterns are compiled and scripts
// joined on first use. The runtime reports what each package's init allocated
// (GODEBUG=inittrace=1); a count, not a time, so a busy machine does not move it.
// Before, three packages allocated 79 to 93 KiB each (the console's and the redactor's
// patterns, the lease's scripts joined with the slots').
func TestStartUpInitAllocatesLittle(t *testing.T) {
	const perPackage, total = 32 << 10, 64 << 10
	cmd := exec.Command(buildBinary(t), "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("version: %v\n%s", err, stderr.Bytes())
	}
	sum, seen := 0, 0
	for pkg, n := range initBytes(stderr.String()) {
		if !strings.HasPrefix(pkg, "github.com/ymirflow/ymirflow") {
			continue
		}
		seen++
		sum += n
		if n > perPackage {
			t.Errorf("%s allocates %d bytes in its initialisation, over %d: do that work on first use", pkg, n, perPackage)
		}
	}
	if seen == 0 {
		t.Fatalf("no init line of this module in the trace:\n%s", stderr.Bytes())
	}
	if sum > total {
		t.Errorf("this module's packages allocate %d bytes in their initialisation, over %d", sum, total)
	}
}

// initBytes is the bytes each package's init allocated, from an inittrace: lines
// "init PKG @T ms, D ms clock, B bytes, A allocs".
func initBytes(trace string) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(trace, "\n") {
		f := strings.Fields(line)
		if len(f) >= 9 && f[0] == "init" && f[8] == "bytes," {
			if n, err := strconv.Atoi(f[7]); err == nil {
				out[f[1]] += n
			}
		}
	}
	return out
}
