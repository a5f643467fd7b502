package runners

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/redact"
)

// Defaults of ExecRunner.
const (
	DefaultKillGrace = 10 * time.Second
	DefaultMaxStdout = 4 << 20
	DefaultMaxStderr = 64 << 10
)

// ExecRunner runs Command with /bin/sh -c once per event, in its own process group:
//
//   - stdin: the Task JSON exactly as received;
//   - environment: Env (see BuildAgentEnv: never the worker's whole environment, never
//     what its EnvPolicy withholds), plus YMIR_AGENT, YMIR_BRANCH, YMIR_ISSUE_KEY, YMIR_FENCE, YMIR_ATTEMPT,
//     YMIR_MESSAGE_ID, YMIR_STREAM, YMIR_USER_TRIGGERED and JIRA_ISSUE (the issue key),
//     and, when ctx carries a trace, TRACEPARENT (and TRACESTATE): the W3C context of
//     the runner's span, so an agent that uses OpenTelemetry continues the trace;
//   - with RunRequest.Mailbox, YMIR_MAILBOX=/dev/fd/3 (the follow-ups); with
//     RunRequest.Control, YMIR_CONTROL_FD: one end of a stream socket pair (the next
//     descriptor), on which the agent sends its control requests and reads the answers;
//     a run that stops after a reservation was denied for its budget returns
//     ErrBudgetExhausted;
//   - stdout: the JSON result (see ParseResult); at most MaxStdout bytes are kept;
//   - a non-zero exit status or output that is not a result is an error (the event is
//     retried); the tail of stderr (at most MaxStderr bytes in the log, 2 KiB in the
//     error), passed through Redactor and redact.Tokens (credential shapes nobody
//     configured), is in the error and in the log, with the issue key;
//   - when ctx is cancelled (lease lost, shutdown) the whole process group gets SIGTERM,
//     then SIGKILL after KillGrace. Processes the command leaves behind in its group when
//     it exits get the same treatment, so nothing of a run outlives it;
//   - the shell gets SIGKILL if the worker dies (Linux parent-death signal). Its own
//     children do not: a worker killed with SIGKILL cannot signal them, so they are
//     reparented; a pod's end takes them.
type ExecRunner struct {
	Command   string
	KillGrace time.Duration // default DefaultKillGrace
	MaxStdout int           // default DefaultMaxStdout
	MaxStderr int           // default DefaultMaxStderr
	// Env is the runner's environment (KEY=VALUE) before the YMIR_* variables, usually
	// BuildAgentEnv(os.Environ(), policy).Env. Nil: the base variables alone.
	Env []string
	Dir string
	// Redactor takes secrets out of the stderr tail before it is logged or returned
	// (credential-shaped text, redact.Tokens, goes whatever it is configured with).
	Redactor *redact.Redactor
	Logger   zerolog.Logger
}

// Run implements Runner.
func (r ExecRunner) Run(ctx context.Context, req RunRequest) (Result, error) {
	if r.Command == "" {
		return Result{}, errors.New("exec runner: no command")
	}
	grace := r.KillGrace
	if grace <= 0 {
		grace = DefaultKillGrace
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("exec runner: not started: %w", context.Cause(ctx))
	}
	log := r.Logger.With().Str("agent", req.Agent).Str("issue_key", req.IssueKey).Str("message_id", req.MessageID).
		Int("attempt", req.Attempt).Logger()

	cmd := exec.Command("/bin/sh", "-c", r.Command)
	cmd.Dir = r.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	env := r.Env
	if env == nil {
		env = BuildAgentEnv(os.Environ(), EnvPolicy{}).Env
	}
	cmd.Env = append(slices.Clone(env),
		"YMIR_AGENT="+req.Agent,
		"YMIR_BRANCH="+req.Branch,
		"YMIR_ISSUE_KEY="+req.IssueKey,
		"YMIR_FENCE="+strconv.FormatInt(req.Fence, 10),
		"YMIR_ATTEMPT="+strconv.Itoa(req.Attempt),
		"YMIR_MESSAGE_ID="+req.MessageID,
		"YMIR_STREAM="+req.Stream,
		"YMIR_USER_TRIGGERED="+strconv.FormatBool(req.UserTriggered),
		"JIRA_ISSUE="+req.IssueKey,
	)
	cmd.Env = appendTraceEnv(ctx, cmd.Env)
	var mb *mailboxFeed
	if req.Mailbox != nil {
		// The agent gets its follow-ups through a pipe on fd 3, never the store itself.
		pr, pw, err := os.Pipe()
		if err != nil {
			return Result{}, fmt.Errorf("exec runner: mailbox pipe: %w", err)
		}
		cmd.ExtraFiles = []*os.File{pr}
		cmd.Env = append(cmd.Env, "YMIR_MAILBOX=/dev/fd/3")
		mb = &mailboxFeed{w: pw, r: pr}
	}
	ctl, err := r.openControl(cmd, req.Control)
	if err != nil {
		mb.close()
		return Result{}, err
	}
	cmd.Stdin = bytes.NewReader(req.Payload)
	stdout := &headBuffer{max: orDefault(r.MaxStdout, DefaultMaxStdout)}
	stderr := &tailBuffer{max: orDefault(r.MaxStderr, DefaultMaxStderr)}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A process left behind holding stdout open must not keep Wait from returning.
	cmd.WaitDelay = time.Second

	start := time.Now()
	if err := cmd.Start(); err != nil {
		mb.close()
		ctl.close()
		return Result{}, fmt.Errorf("exec runner: start: %w", err)
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	mb.start(ctx, req.Mailbox, log)
	ctl.start(ctx, req.Control, log)

	var waitErr error
	var termAt time.Time
	select {
	case waitErr = <-exited:
	case <-ctx.Done():
		termAt = time.Now()
		log.Warn().Err(context.Cause(ctx)).Dur("kill_grace", grace).Msg("runner cancelled: SIGTERM to its process group")
		signalGroup(pgid, syscall.SIGTERM)
		t := time.NewTimer(grace)
		select {
		case waitErr = <-exited:
			t.Stop()
		case <-t.C:
			log.Warn().Msg("runner still running after the kill grace: SIGKILL to its process group")
			signalGroup(pgid, syscall.SIGKILL)
			waitErr = <-exited
		}
	}
	// The shell is gone; end whatever it left in its group.
	if groupAlive(pgid) {
		if termAt.IsZero() {
			termAt = time.Now()
			signalGroup(pgid, syscall.SIGTERM)
		}
		for groupAlive(pgid) && time.Since(termAt) < grace {
			time.Sleep(10 * time.Millisecond)
		}
		if groupAlive(pgid) {
			signalGroup(pgid, syscall.SIGKILL)
		}
	}
	took := time.Since(start)
	delivered := mb.stop()
	ctl.stop()

	// The configured secrets, and anything shaped like a credential (a token the agent
	// printed that nobody configured), as a Jira comment's text is masked.
	errTail := []byte(redact.Tokens(string(r.Redactor.Bytes(bytes.TrimSpace(stderr.Bytes())))))
	if len(errTail) > 0 {
		log.Info().Str("stderr", string(errTail)).Bool("stderr_truncated", stderr.dropped > 0).Msg("runner stderr")
	}
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("exec runner: cancelled after %s: %w", took.Round(time.Millisecond), context.Cause(ctx))
	}
	res, err := r.result(req, waitErr, stdout, errTail)
	if exhausted(req, res, err) {
		return Result{}, fmt.Errorf("exec runner: the agent stopped after its budget was exhausted: %w", ErrBudgetExhausted)
	}
	if err != nil {
		return Result{}, err
	}
	res.Delivered = delivered
	// An acknowledgement counts only for a follow-up this run was given.
	res.FollowupsAcked = slices.DeleteFunc(res.FollowupsAcked, func(id string) bool { return !slices.Contains(delivered, id) })
	log.Debug().Dur("took", took).Int("followups_delivered", len(delivered)).Msg("runner finished")
	return res, nil
}

// result is the run's result from its exit and stdout.
func (r ExecRunner) result(req RunRequest, waitErr error, stdout *headBuffer, errTail []byte) (Result, error) {
	if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			return Result{}, fmt.Errorf("exec runner: %s%s", describeExit(ee), stderrNote(errTail))
		}
		return Result{}, fmt.Errorf("exec runner: %w%s", waitErr, stderrNote(errTail))
	}
	if stdout.dropped > 0 {
		return Result{}, fmt.Errorf("%w: stdout exceeds %d bytes%s", ErrBadOutput, stdout.max, stderrNote(errTail))
	}
	res, err := ParseResult(req.Agent, stdout.Bytes())
	if err != nil {
		return Result{}, fmt.Errorf("exec runner: %w%s", err, stderrNote(errTail))
	}
	return res, nil
}

// exhausted reports whether a run ended for its budget: a reservation was denied and
// the run then failed or reported no success.
func exhausted(req RunRequest, res Result, err error) bool {
	if req.Control == nil || !req.Control.Exhausted() {
		return false
	}
	if err != nil {
		return true
	}
	if req.Agent == "triage" {
		return res.Resolution == ResolutionError
	}
	return !res.Success
}

// openControl gives the agent its control channel: one end of a socket pair, as the
// next descriptor after the mailbox's, named by YMIR_CONTROL_FD. Nil without a Control.
func (r ExecRunner) openControl(cmd *exec.Cmd, c Control) (*controlFeed, error) {
	if c == nil {
		return nil, nil
	}
	f, err := newControlFeed()
	if err != nil {
		return nil, fmt.Errorf("exec runner: %w", err)
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f.theirs)
	cmd.Env = append(cmd.Env, "YMIR_CONTROL_FD="+strconv.Itoa(2+len(cmd.ExtraFiles)))
	return f, nil
}

// mailboxFeed writes a run's follow-ups to the agent's YMIR_MAILBOX pipe, one JSON
// object a line, while the run lasts. A nil feed does nothing.
type mailboxFeed struct {
	w, r   *os.File
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	sent   []string
}

func (f *mailboxFeed) start(ctx context.Context, m Mailbox, log zerolog.Logger) {
	if f == nil {
		return
	}
	_ = f.r.Close() // the agent holds the read end now
	ctx, f.cancel = context.WithCancel(ctx)
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		for ctx.Err() == nil {
			fs, err := m.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn().Err(err).Msg("mailbox read failed; retrying")
					select {
					case <-ctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
				}
				continue
			}
			for _, fu := range fs {
				line, err := json.Marshal(fu)
				if err != nil {
					continue
				}
				// A write blocks while the agent does not read (the pipe's buffer is
				// full); stop's Close ends it. Only a whole line written counts.
				if _, err := f.w.Write(append(line, '\n')); err != nil {
					return
				}
				f.mu.Lock()
				f.sent = append(f.sent, fu.ID)
				f.mu.Unlock()
				log.Info().Str("followup_id", fu.ID).Str("event_type", fu.Fields["event_type"]).Msg("follow-up delivered to the agent's mailbox")
			}
		}
	}()
}

// stop ends the feed (the run is over: the agent reads to the end of the pipe) and
// returns the ids written, in order.
func (f *mailboxFeed) stop() []string {
	if f == nil {
		return nil
	}
	f.cancel()
	_ = f.w.Close()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent
}

func (f *mailboxFeed) close() {
	if f != nil {
		_ = f.r.Close()
		_ = f.w.Close()
	}
}

func describeExit(ee *exec.ExitError) string {
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by signal " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ee.ExitCode())
}

func stderrNote(tail []byte) string {
	if len(tail) == 0 {
		return ""
	}
	const n = 2048
	if len(tail) > n {
		tail = append([]byte("…"), tail[len(tail)-n:]...)
	}
	return "; stderr: " + string(tail)
}

func signalGroup(pgid int, sig syscall.Signal) { _ = syscall.Kill(-pgid, sig) }

// groupAlive reports whether a live (not zombie) process of the group remains. Zombies
// are skipped: orphans reparented to a PID 1 that never reaps them (a worker running as
// a container's PID 1) stay zombies, and they hold nothing.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			return true
		}
	}
	return false
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// headBuffer keeps the first max bytes written and counts the rest.
type headBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	max     int
	dropped int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.max - b.buf.Len()
	if room >= len(p) {
		b.buf.Write(p)
	} else {
		if room > 0 {
			b.buf.Write(p[:room])
		}
		b.dropped += len(p) - max(room, 0)
	}
	return len(p), nil
}

func (b *headBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu      sync.Mutex
	buf     []byte
	max     int
	dropped int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.dropped += over
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf)
}
