// Command agent is a small ymirflow agent for the exec runner, in Go with the standard
// library only. It shows the whole contract (examples/agents/README.md):
//
//   - the Task JSON on stdin, the YMIR_* variables in the environment;
//   - follow-ups read from YMIR_MAILBOX (newline-delimited JSON) while it works, and the
//     ones it took into account acknowledged in its result ("followups_acked"); the
//     follow-ups of earlier runs that nobody acknowledged come in the Task JSON
//     ("followups");
//   - YMIR_FENCE stamped on every side effect: a commit trailer and a comment marker,
//     and nothing written over a newer run's work (a higher fence);
//   - SIGTERM (lease lost, shutdown) handled well within KILL_GRACE: stop, write nothing
//     more, exit 143;
//   - the result JSON on stdout, everything else on stderr.
//
// With a control channel (YMIR_CONTROL_FD, package ymirctl) it also works in AGENT_STEPS
// steps (default 1), each an LLM call: a permit for llm:<AGENT_MODEL>, a reservation of
// AGENT_STEP_USD (default 0.01), the call (POST AGENT_LLM_URL/v1/complete, or simulated at
// that cost without AGENT_LLM_URL), the usage report, and a checkpoint of the steps done.
// A run that finds a checkpoint in its Task JSON ("checkpoint") skips the steps it lists.
// A denied reservation ends the run (exit 2: ymirflow records budget.exhausted and parks
// the issue); a 429 is reported (the permits of every worker shrink) and the call retried.
//
// Its "work" is simulated: it waits AGENT_WORK_MS milliseconds (default 300), then
// commits a note into a git repository and writes a comment file under AGENT_WORKDIR
// (default $TMPDIR/ymir-agent-kit), one per issue. Triage answers AGENT_RESOLUTION
// (default "postponed"); the other agents answer success. The mailbox's opening and each
// follow-up's arrival are noted in AGENT_WORKDIR/<agent>/mailbox-<issue>.log; AGENT_NO_ACK=1 acknowledges none.
//
// Build it with `go build -o agent ./examples/agents/go` and run the worker with
// `--exec ./agent`.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ymirflow/ymirflow/examples/agents/go/ymirctl"
)

const trailer = "Ymir-Fence"

var marker = regexp.MustCompile(`<!-- ymir-fence: (\S+) (\S+) (\d+) -->`)

// Followup is one line of YMIR_MAILBOX, or one element of the Task JSON's "followups".
// Other fields (message_id, issue_key, at) are ignored here.
type Followup struct {
	ID        string `json:"id"`
	EventType string `json:"event_type"`
	Author    string `json:"author,omitempty"`
	Body      string `json:"body,omitempty"`
	CommentID string `json:"comment_id,omitempty"`
}

// task is the part of the Task JSON this agent reads; a real agent reads metadata too.
type task struct {
	Metadata   map[string]any `json:"metadata"`
	Followups  []Followup     `json:"followups"`
	Checkpoint *checkpoint    `json:"checkpoint"`
}

// checkpoint is the progress this agent saves (and finds in the next run's Task JSON).
type checkpoint struct {
	Plan      []string `json:"plan"`
	Completed []string `json:"completed"`
	BranchSHA string   `json:"branch_sha"`
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, "agent: "+format+"\n", a...) }

type agent struct {
	name, issue string
	fence       int64
	workdir     string

	mu        sync.Mutex
	followups []Followup // read from the mailbox during this run, in its order
}

func main() { os.Exit(run()) }

func run() int {
	// SIGTERM cancels ctx; every step checks it, so the agent stops within milliseconds.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var t task
	if err := json.NewDecoder(os.Stdin).Decode(&t); err != nil {
		logf("the Task JSON on stdin: %v", err)
		return 1
	}
	a := &agent{name: os.Getenv("YMIR_AGENT"), issue: os.Getenv("YMIR_ISSUE_KEY")}
	a.fence, _ = strconv.ParseInt(os.Getenv("YMIR_FENCE"), 10, 64)
	root := os.Getenv("AGENT_WORKDIR")
	if root == "" {
		root = filepath.Join(os.TempDir(), "ymir-agent-kit")
	}
	a.workdir = filepath.Join(root, a.name)
	logf("started: %s %s, fence %d", a.name, a.issue, a.fence) // after the SIGTERM handler is in place
	if p := os.Getenv("YMIR_MAILBOX"); p != "" {
		go a.readMailbox(p)
	}
	ctl, err := ymirctl.FromEnv()
	if err != nil {
		logf("control channel: %v", err)
		return 1
	}
	if ctl != nil {
		err = a.llmSteps(ctx, ctl, t)
	}
	var res map[string]any
	if err == nil {
		res, err = a.work(ctx, t)
	}
	switch {
	case errors.Is(err, ymirctl.ErrBudgetExhaust):
		logf("budget exhausted: %v", err)
		return 2
	case errors.Is(err, ymirctl.ErrStaleFence), errors.Is(err, ymirctl.ErrClosed):
		logf("the run is over (%v): stopping, nothing more written", err)
		return 143
	case ctx.Err() != nil:
		logf("SIGTERM: stopping, nothing more written")
		return 143
	case err != nil:
		logf("failed: %v", err) // a failed attempt: the worker retries, then dead-letters
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// readMailbox reads follow-ups, one JSON object a line, until the worker closes the
// mailbox at the run's end.
func (a *agent) readMailbox(path string) {
	f, err := os.Open(path)
	if err != nil {
		logf("mailbox: %v", err)
		return
	}
	defer func() { _ = f.Close() }() // read-only: nothing to flush
	a.trace([]byte(`{"mailbox":"open"}`))
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var fu Followup
		if err := json.Unmarshal(sc.Bytes(), &fu); err != nil {
			logf("mailbox: skipping a line that is not JSON")
			continue
		}
		a.mu.Lock()
		a.followups = append(a.followups, fu)
		a.mu.Unlock()
		a.trace(sc.Bytes())
		logf("follow-up %s from %s: %.80s", fu.ID, fu.Author, or(fu.Body, fu.EventType))
	}
}

// trace notes a follow-up's arrival (a file per issue), for whoever watches the agent.
func (a *agent) trace(line []byte) {
	if err := os.MkdirAll(a.workdir, 0o755); err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(a.workdir, "mailbox-"+a.issue+".log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	_, _ = f.Write(append(append([]byte(nil), line...), '\n'))
	_ = f.Close()
}

func (a *agent) work(ctx context.Context, t task) (map[string]any, error) {
	for _, fu := range t.Followups {
		logf("follow-up %s (from an earlier run) from %s", fu.ID, fu.Author)
	}
	ms, _ := strconv.Atoi(os.Getenv("AGENT_WORK_MS"))
	if ms <= 0 {
		ms = 300
	}
	select { // the work
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Duration(ms) * time.Millisecond):
	}
	a.mu.Lock()
	live := append([]Followup(nil), a.followups...)
	a.mu.Unlock()
	heard := append(append([]Followup(nil), t.Followups...), live...)
	note := fmt.Sprintf("%s %s: done (fence %d), %d follow-up(s) heard", a.name, a.issue, a.fence, len(heard))
	if err := a.commit(ctx, note); err != nil {
		return nil, err
	}
	var text strings.Builder
	text.WriteString(note)
	ids := []string{}
	for _, fu := range heard {
		fmt.Fprintf(&text, "\n- %s: %s", fu.Author, fu.Body)
		ids = append(ids, fu.ID)
	}
	if err := a.comment(ctx, text.String()); err != nil {
		return nil, err
	}
	// Acknowledge what this run took into account; AGENT_NO_ACK=1 plays an agent that
	// did not (its follow-ups then start the next run).
	acked := []string{}
	for _, fu := range live {
		if os.Getenv("AGENT_NO_ACK") != "1" {
			acked = append(acked, fu.ID)
		}
	}
	res := map[string]any{"followups_acked": acked}
	data := map[string]any{"details": note, "followups": ids, "fence": a.fence}
	if a.name == "triage" {
		res["resolution"] = or(os.Getenv("AGENT_RESOLUTION"), "postponed")
		res["data"] = data
		if b := os.Getenv("AGENT_TARGET_BRANCH"); b != "" {
			res["target_branch"] = b
		}
	} else {
		res["success"] = true
	}
	return res, nil
}

func (a *agent) tag() string { return fmt.Sprintf("%s/%s/%d", a.name, a.issue, a.fence) }

// commit commits note with the fence trailer, unless HEAD carries a higher fence.
func (a *agent) commit(ctx context.Context, note string) error {
	repo := filepath.Join(a.workdir, "repo-"+a.issue)
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return err
	}
	git := func(args ...string) ([]byte, error) {
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=ymir agent",
			"-c", "user.email=agent@ymirflow.invalid"}, args...)...)
		if args[0] != "log" { // log fails on a repository without commits yet: expected
			cmd.Stderr = os.Stderr
		}
		return cmd.Output()
	}
	if _, err := os.Stat(filepath.Join(repo, ".git")); err != nil {
		if _, err := git("init", "-q"); err != nil {
			return fmt.Errorf("git init: %w", err)
		}
	}
	head, _ := git("log", "-1", "--format=%(trailers:key="+trailer+",valueonly)") // empty repo: no HEAD
	for _, v := range strings.Fields(string(head)) {
		theirs, _ := strconv.ParseInt(v[strings.LastIndexByte(v, '/')+1:], 10, 64)
		if theirs > a.fence {
			return fmt.Errorf("refusing to commit: HEAD carries fence %d, newer than ours (%d)", theirs, a.fence)
		}
	}
	f, err := os.OpenFile(filepath.Join(repo, "NOTES"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, note)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if ctx.Err() != nil { // the last moment to give up before the side effect
		return ctx.Err()
	}
	if _, err := git("add", "NOTES"); err != nil {
		return fmt.Errorf("git add: %w", err)
	}
	if _, err := git("commit", "-q", "-m", note, "--trailer", trailer+": "+a.tag()); err != nil {
		return fmt.Errorf("git commit: %w", err)
	}
	return nil
}

// comment writes the issue's comment with the fence marker, unless it holds a higher
// one. A real agent edits a Jira comment or a merge request description the same way:
// read, compare the marker's fence, write only if ours is not older.
func (a *agent) comment(ctx context.Context, text string) error {
	path := filepath.Join(a.workdir, "comments", a.issue+".md")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, m := range marker.FindAllStringSubmatch(string(old), -1) {
		if theirs, _ := strconv.ParseInt(m[3], 10, 64); m[1] == a.name && m[2] == a.issue && theirs > a.fence {
			logf("comment: skipped, it holds fence %d, newer than ours (%d)", theirs, a.fence)
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	body := fmt.Sprintf("%s\n\n<!-- ymir-fence: %s %s %d -->\n", text, a.name, a.issue, a.fence)
	if err := os.WriteFile(path+".tmp", []byte(body), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// llmSteps works in AGENT_STEPS metered, checkpointed LLM calls, skipping those the
// Task's checkpoint lists as done.
func (a *agent) llmSteps(ctx context.Context, ctl *ymirctl.Control, t task) error {
	steps, _ := strconv.Atoi(or(os.Getenv("AGENT_STEPS"), "1"))
	model := or(os.Getenv("AGENT_MODEL"), "fake")
	cost, _ := strconv.ParseFloat(or(os.Getenv("AGENT_STEP_USD"), "0.01"), 64)
	ck := checkpoint{Completed: []string{}}
	if t.Checkpoint != nil {
		ck.Completed = append(ck.Completed, t.Checkpoint.Completed...)
		logf("resuming from a checkpoint: %d of %d steps done", len(ck.Completed), steps)
	}
	for i := 1; i <= steps; i++ {
		ck.Plan = append(ck.Plan, fmt.Sprintf("step-%d", i))
	}
	for _, step := range ck.Plan {
		if slices.Contains(ck.Completed, step) {
			continue
		}
		if err := ctl.Permit(ctx, "llm:"+model); err != nil {
			return err
		}
		ok, err := ctl.Reserve(cost)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: reservation of %.4f USD denied", ymirctl.ErrBudgetExhaust, cost)
		}
		u, err := a.callLLM(ctx, ctl, model, cost)
		if err != nil {
			return err
		}
		if err := ctl.Usage(u); err != nil {
			return err
		}
		ck.Completed = append(ck.Completed, step)
		if err := ctl.Checkpoint(ck); err != nil {
			return err
		}
	}
	return nil
}

// callLLM makes one call to AGENT_LLM_URL (simulated at cost without it); a 429 is
// reported on the channel and the call retried once a permit allows.
func (a *agent) callLLM(ctx context.Context, ctl *ymirctl.Control, model string, cost float64) (ymirctl.Usage, error) {
	url := os.Getenv("AGENT_LLM_URL")
	if url == "" {
		return ymirctl.Usage{Model: model, TokensIn: 100, TokensOut: 20, CostUSD: cost, ToolCalls: 1}, nil
	}
	for {
		body := strings.NewReader(`{"model":"` + model + `"}`)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/complete", body)
		if err != nil {
			return ymirctl.Usage{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return ymirctl.Usage{}, err
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			_ = resp.Body.Close()
			if err := ctl.Throttled("llm:"+model, time.Duration(max(after, 1))*time.Second); err != nil {
				return ymirctl.Usage{}, err
			}
			if err := ctl.Permit(ctx, "llm:"+model); err != nil {
				return ymirctl.Usage{}, err
			}
			continue
		}
		var u ymirctl.Usage
		err = json.NewDecoder(resp.Body).Decode(&u)
		_ = resp.Body.Close()
		if err != nil {
			return ymirctl.Usage{}, fmt.Errorf("llm call: status %d: %w", resp.StatusCode, err)
		}
		if resp.StatusCode != http.StatusOK {
			return ymirctl.Usage{}, fmt.Errorf("llm call: status %d", resp.StatusCode)
		}
		u.Model, u.ToolCalls = model, 1
		return u, nil
	}
}
