// Package testlog captures what code under test logs: Buffer is a goroutine-safe
// io.Writer to hand a zerolog logger (or a command's stdout and stderr) whose text a test
// reads while the writers still run.
//
// It is a test kit: only _test.go files import it. Production code that needs a
// goroutine-safe writer wraps it with zerolog.SyncWriter.
package testlog

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer collects writes from several goroutines. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Messages returns the JSON log lines written so far whose zerolog message starts with
// msg, in order.
func (b *Buffer) Messages(msg string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, `"message":"`+msg) {
			out = append(out, l)
		}
	}
	return out
}
