package testlog_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/testlog"
)

func TestBufferTakesWritesFromManyGoroutines(t *testing.T) {
	t.Parallel()
	var buf testlog.Buffer
	log := zerolog.New(&buf)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				log.Info().Int("g", i).Int("j", j).Msg("line")
				_ = buf.String() // read while others write (the race detector checks)
			}
		}()
	}
	wg.Wait()
	if n := len(buf.Messages("line")); n != 400 {
		t.Fatalf("%d lines, want 400", n)
	}
}

func ExampleBuffer() {
	var buf testlog.Buffer
	log := zerolog.New(&buf)
	log.Warn().Str("issue_key", "RHEL-1").Msg("fenced write refused: the lease is lost")
	log.Info().Msg("done")
	fmt.Println(buf.Messages("fenced write refused"))
	// Output: [{"level":"warn","issue_key":"RHEL-1","message":"fenced write refused: the lease is lost"}]
}
