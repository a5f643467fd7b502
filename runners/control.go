package runners

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/rs/zerolog"
)

// Control serves a run's control channel (RunRequest.Control): the agent's requests,
// one JSON object a line, each answered with one line (package agentctl).
type Control interface {
	// Serve answers the requests read from rw until its end or ctx's.
	Serve(ctx context.Context, rw io.ReadWriter) error
	// Exhausted reports whether a reservation of the run was denied for its budget.
	Exhausted() bool
}

// ErrBudgetExhausted ends a run whose reservation was denied for its budget and that
// then gave up (failed, or reported no success): the handler records the typed outcome
// budget.exhausted and parks the issue instead of retrying it.
var ErrBudgetExhausted = errors.New("budget.exhausted")

// WithCheckpoint returns the Task JSON payload with "checkpoint" set to cp (the last
// checkpoint saved for the agent, a JSON object), other fields untouched.
func WithCheckpoint(payload, cp []byte) ([]byte, error) {
	var task map[string]json.RawMessage
	if err := json.Unmarshal(payload, &task); err != nil {
		return nil, err
	}
	if !json.Valid(cp) {
		return nil, errors.New("checkpoint is not JSON")
	}
	task["checkpoint"] = cp
	return json.Marshal(task)
}

// controlFeed serves the agent's end of a socket pair: a stream socket, so the
// agent reads its answers from the descriptor it writes its requests to. A nil feed
// does nothing.
type controlFeed struct {
	ours, theirs *os.File
	done         chan struct{}
	err          error
	once         sync.Once
}

func newControlFeed() (*controlFeed, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket pair: %w", err)
	}
	// Ours non-blocking, so that Close ends a pending Read (the runtime's poller).
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		_ = syscall.Close(fds[0])
		_ = syscall.Close(fds[1])
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return &controlFeed{ours: os.NewFile(uintptr(fds[0]), "control"), theirs: os.NewFile(uintptr(fds[1]), "control-agent")}, nil
}

func (f *controlFeed) start(ctx context.Context, c Control, log zerolog.Logger) {
	if f == nil {
		return
	}
	_ = f.theirs.Close() // the agent holds its end now
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		f.err = c.Serve(ctx, f.ours)
		if f.err != nil && ctx.Err() == nil && !errors.Is(f.err, os.ErrClosed) {
			log.Warn().Err(f.err).Msg("agent control channel ended")
		}
		f.close()
	}()
}

// stop ends the channel (the run is over) and waits for its server.
func (f *controlFeed) stop() {
	if f == nil {
		return
	}
	f.close()
	if f.done != nil {
		<-f.done
	}
}

func (f *controlFeed) close() {
	if f == nil {
		return
	}
	f.once.Do(func() {
		_ = f.ours.Close()
		_ = f.theirs.Close()
	})
}
