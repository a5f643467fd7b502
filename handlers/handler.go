package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"

	"github.com/ymirflow/ymirflow/internal/jira"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/pipeline"
)

// JiraAPI is what the handlers need from Jira; *jira.Client implements it.
type JiraAPI interface {
	GetIssue(ctx context.Context, key string, fields []string) (jira.Issue, error)
	UpdateLabels(ctx context.Context, key string, add, remove []string) error
	AddComment(ctx context.Context, key, body string) error
}

var _ JiraAPI = (*jira.Client)(nil)

// Config configures one agent's handler.
type Config struct {
	// Agent is triage, rebase, backport or rebuild; Branch (c9s, c10s) is required for
	// every agent but triage.
	Agent, Branch string
	Runner        Runner
	// Jira reads labels and status and writes labels and comments. Nil: no Jira at all
	// (the agent-side dedup is skipped and every write is logged instead).
	Jira JiraAPI
	// Publisher publishes triage's downstream requests (required for triage). Inside a
	// lock middleware handler its publishes are fenced.
	Publisher *pipeline.Publisher
	// Results receives every terminal outcome.
	Results  *pipeline.Results
	Topology pipeline.Topology
	// MaxRetries is the router's number of attempts (RouterConfig.MaxRetries); the last
	// one writes the _errored label. Default pipeline.DefaultMaxRetries.
	MaxRetries int
	Logger     zerolog.Logger
	// DryRun logs Jira writes (labels, comments) instead of sending them; reads are sent.
	DryRun bool
}

// New returns the handler of cfg.Agent, to be given to pipeline.RouterConfig.Handler.
func New(cfg Config) (message.NoPublishHandlerFunc, error) {
	if err := pipeline.CheckAgent(cfg.Agent, cfg.Branch); err != nil {
		return nil, fmt.Errorf("handlers: %w", err)
	}
	if cfg.Runner == nil {
		return nil, errors.New("handlers: Config.Runner is nil")
	}
	if cfg.Results == nil {
		return nil, errors.New("handlers: Config.Results is nil")
	}
	if cfg.Agent == "triage" && cfg.Publisher == nil {
		return nil, errors.New("handlers: the triage handler needs Config.Publisher")
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = pipeline.DefaultMaxRetries
	}
	if cfg.MaxRetries < 1 {
		return nil, fmt.Errorf("handlers: MaxRetries must be at least 1, got %d", cfg.MaxRetries)
	}
	h := &handler{cfg: cfg, memo: map[string]*progress{}, now: time.Now}
	h.log = cfg.Logger.With().Str("agent", cfg.Agent).Logger()
	if cfg.Branch != "" {
		h.log = h.log.With().Str("branch", cfg.Branch).Logger()
	}
	if cfg.Agent == "triage" {
		return h.triage, nil
	}
	return h.downstream, nil
}

type handler struct {
	cfg Config
	log zerolog.Logger
	now func() time.Time

	mu   sync.Mutex
	memo map[string]*progress
}

// progress remembers what one event's attempts have done already, so that a retry
// (after a runner failure, a Jira outage or a Redis error) neither re-runs the runner
// after it succeeded nor publishes the downstream request twice.
type progress struct {
	fence     int64 // lease of the current delivery
	base      int   // attempt number at which the current delivery started
	claimed   bool
	acked     bool
	result    *Result
	published bool
	stream    string
	streamID  string
	labelled  bool
	unclaimed bool
	touched   time.Time
}

// Memo bounds: entries of events that ended elsewhere (lease lost, then run by another
// worker) are dropped after memoTTL, and the table never grows past memoMax.
const (
	memoTTL = 24 * time.Hour
	memoMax = 10_000
)

// event is one attempt at one message.
type event struct {
	msg           *message.Message
	task          pipeline.Task
	key           string
	memoKey       string
	p             *progress
	attempt       int // metadata attempt (1-based, over every delivery in this process)
	delivery      int // attempt within the current delivery (lease)
	last          bool
	userTriggered bool
	fence         int64
	log           zerolog.Logger
}

func (h *handler) begin(msg *message.Message) (*event, error) {
	task, err := pipeline.ParseTask(msg.Payload)
	if err != nil {
		return nil, err
	}
	raw := msg.Metadata.Get(pipeline.MetaIssueKey)
	if raw == "" {
		raw = task.IssueKey()
	}
	key, err := lockmw.Canonicalize(raw, lockmw.DefaultKeyPattern)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", pipeline.ErrBadEvent, err)
	}
	ev := &event{msg: msg, task: task, key: key}
	ev.userTriggered = task.UserTriggered || msg.Metadata.Get(pipeline.MetaUserTriggered) == "true"
	ev.attempt, _ = strconv.Atoi(msg.Metadata.Get(pipeline.MetaAttempt))
	ev.attempt = max(ev.attempt, 1)
	if lease, ok := lockmw.LeaseFrom(msg.Context()); ok {
		ev.fence = lease.Fence()
	}
	ev.memoKey = pipeline.EntryID(msg) + "|" + msg.UUID

	h.mu.Lock()
	now := h.now()
	p := h.memo[ev.memoKey]
	switch {
	case p == nil:
		h.prune(now)
		p = &progress{fence: ev.fence, base: ev.attempt}
		h.memo[ev.memoKey] = p
	case p.fence != ev.fence || ev.attempt < p.base:
		// A new delivery (the lease was lost or given up, and taken again): its attempts
		// count afresh, and triage claims the issue again after a fresh look at its
		// labels (the claim removes the resolution label, so that is written again too).
		// The runner's result and a publish are kept: they are done for good. Once the
		// result is known the remaining steps just finish (a fresh look would find our
		// own resolution label, skip, and lose the outcome record).
		p.fence, p.base = ev.fence, ev.attempt
		if h.cfg.Agent == "triage" && p.result == nil {
			p.claimed, p.labelled, p.unclaimed = false, false, false
		}
	}
	p.touched = now
	h.mu.Unlock()

	ev.p = p
	ev.delivery = ev.attempt - p.base + 1
	ev.last = ev.delivery >= h.cfg.MaxRetries
	ev.log = h.log.With().Str("issue_key", key).Str("message_id", pipeline.EntryID(msg)).
		Str("correlation_id", msg.Metadata.Get(pipeline.MetaCorrelationID)).Int64("fence", ev.fence).
		Int("attempt", ev.delivery).Logger()
	return ev, nil
}

func (h *handler) forget(ev *event) {
	h.mu.Lock()
	delete(h.memo, ev.memoKey)
	h.mu.Unlock()
}

// prune runs with h.mu held.
func (h *handler) prune(now time.Time) {
	if len(h.memo) < memoMax/2 {
		return
	}
	for k, p := range h.memo {
		if now.Sub(p.touched) > memoTTL {
			delete(h.memo, k)
		}
	}
	for len(h.memo) >= memoMax {
		var oldest string
		var at time.Time
		for k, p := range h.memo {
			if oldest == "" || p.touched.Before(at) {
				oldest, at = k, p.touched
			}
		}
		delete(h.memo, oldest)
	}
}

// ---- triage ----

func (h *handler) triage(msg *message.Message) error {
	ctx := msg.Context()
	ev, err := h.begin(msg)
	if err != nil {
		return err
	}
	p := ev.p
	if !p.claimed {
		labels, status, known, err := h.readIssue(ctx, ev.key)
		if err != nil {
			return h.jiraErr(ctx, ev, "read the issue's labels and status", err)
		}
		if known && isClosed(status) {
			return h.skipClosed(ctx, ev, labels, status)
		}
		if known && alreadyTriaged(labels, ev.userTriggered) {
			return h.skip(ctx, ev, fmt.Sprintf("already handled: labels %s and no trigger", strings.Join(ymirLabels(labels), ",")))
		}
		var remove []string
		for _, l := range ymirLabels(labels) {
			if l != LabelTriageInProgress {
				remove = append(remove, l)
			}
		}
		if err := h.setLabels(ctx, ev, []string{LabelTriageInProgress}, remove); err != nil {
			return h.jiraErr(ctx, ev, "claim the issue ("+LabelTriageInProgress+")", err)
		}
		p.claimed = true
		if ev.userTriggered && !p.acked {
			h.comment(ctx, ev, "ymirflow picked up the triage request for "+ev.key+".")
			p.acked = true
		}
	}

	if p.result == nil {
		res, err := h.run(ctx, ev)
		if err == nil && res.Resolution == ResolutionError {
			err = fmt.Errorf("triage resolved to error: %s", errorDetails(res.Data))
		}
		if err != nil {
			return h.triageFailed(ctx, ev, err)
		}
		p.result = &res
	}
	res := *p.result

	stream, dispatch := Dispatch(h.cfg.Topology, res.Resolution, res.TargetBranch, ev.userTriggered)
	label := ResolutionLabel(res.Resolution)
	if !dispatch {
		if !p.labelled {
			if err := h.setLabels(ctx, ev, []string{label}, []string{LabelTriageInProgress}); err != nil {
				return h.jiraErr(ctx, ev, "write the resolution label "+label, err)
			}
			p.labelled, p.unclaimed = true, true
		}
	} else {
		// Label, publish, unclaim: the resolution label is there before the downstream
		// agent can see the request (it removes that label when done), and the claim
		// stays until the request is out, so a crash or a lost lease in between leaves
		// an issue that the redelivery triages again, never a labelled issue with no
		// request behind it.
		if !p.labelled {
			if err := h.setLabels(ctx, ev, []string{label}, nil); err != nil {
				return h.jiraErr(ctx, ev, "write the resolution label "+label, err)
			}
			p.labelled = true
		}
		if !p.published {
			if err := aborted(ctx); err != nil {
				return err
			}
			out, err := h.downstreamEvent(ev, res)
			if err != nil {
				return fmt.Errorf("triage of %s: build the downstream request: %w", ev.key, err)
			}
			id, err := h.cfg.Publisher.PublishID(ctx, stream, out)
			if err != nil {
				return h.redisErr(ctx, ev, "publish the "+res.Resolution+" request", err)
			}
			p.published, p.stream, p.streamID = true, stream, id
			ev.log.Info().Str("stream", stream).Str("stream_id", id).Str("target_branch", res.TargetBranch).
				Msg("downstream request published")
		}
		if !p.unclaimed {
			if err := h.setLabels(ctx, ev, nil, []string{LabelTriageInProgress}); err != nil {
				return h.jiraErr(ctx, ev, "remove "+LabelTriageInProgress, err)
			}
			p.unclaimed = true
		}
	}
	detail := map[string]any{"resolution": res.Resolution, "label": label, "target_branch": res.TargetBranch,
		"data": rawOrNull(res.Data)}
	if p.published {
		detail["stream"], detail["stream_id"] = p.stream, p.streamID
	} else if IsDispatched(res.Resolution) {
		detail["dispatched"] = false
		detail["reason"] = "no target branch"
	}
	if err := h.record(ctx, ev, pipeline.EventStageDone, res.Resolution, detail); err != nil {
		return err
	}
	ev.log.Info().Str("resolution", res.Resolution).Str("label", label).Bool("dispatched", p.published).Msg("triage done")
	h.forget(ev)
	return nil
}

// alreadyTriaged is triage's agent-side dedup (upstream triage_agent.py:1277-1299):
// skip when a terminal ymir label is present and neither a retry trigger, an in-flight
// claim nor a maintainer's request says to run again.
func alreadyTriaged(labels []string, userTriggered bool) bool {
	if userTriggered || slices.Contains(labels, LabelRetryNeeded) || slices.Contains(labels, LabelTriageInProgress) {
		return false
	}
	return slices.ContainsFunc(labels, IsTerminalLabel)
}

func isClosed(status string) bool {
	return strings.EqualFold(status, "Closed") || strings.EqualFold(status, "Done")
}

func (h *handler) skipClosed(ctx context.Context, ev *event, labels []string, status string) error {
	// Unlike upstream, the in-flight claim a fetcher flip left is removed too, or the
	// closed issue would look in flight for ever (upstream weak point 14).
	var remove []string
	if slices.Contains(labels, LabelTriageInProgress) {
		remove = append(remove, LabelTriageInProgress)
	}
	if ev.userTriggered && slices.Contains(labels, LabelTodo) {
		remove = append(remove, LabelTodo)
	}
	if len(remove) > 0 && !ev.p.labelled {
		if err := h.setLabels(ctx, ev, nil, remove); err != nil {
			return h.jiraErr(ctx, ev, "remove "+strings.Join(remove, ","), err)
		}
		ev.p.labelled = true
	}
	if ev.userTriggered && !ev.p.acked {
		h.comment(ctx, ev, fmt.Sprintf("ymirflow: %s is already %s; nothing to triage.", ev.key, status))
		ev.p.acked = true
	}
	return h.skip(ctx, ev, "issue is "+status)
}

func (h *handler) skip(ctx context.Context, ev *event, reason string) error {
	if err := h.record(ctx, ev, pipeline.EventStageDone, "skipped", map[string]any{"reason": reason}); err != nil {
		return err
	}
	ev.log.Info().Str("reason", reason).Msg("skipped")
	h.forget(ev)
	return nil
}

func (h *handler) triageFailed(ctx context.Context, ev *event, cause error) error {
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("triage of %s interrupted: %w: %w", ev.key, a, cause)
	}
	if !ev.last {
		ev.log.Warn().Err(cause).Int("max_retries", h.cfg.MaxRetries).Msg("triage failed; it will be retried")
		return cause
	}
	wctx, cancel := writable(ctx)
	defer cancel()
	if !ev.p.labelled {
		if err := h.setLabels(wctx, ev, []string{LabelTriageErrored}, []string{LabelTriageInProgress}); err != nil {
			return h.jiraErr(wctx, ev, "write "+LabelTriageErrored, err)
		}
		ev.p.labelled = true
	}
	if ev.userTriggered {
		h.comment(wctx, ev, fmt.Sprintf("ymirflow: triage of %s failed %d times: %s", ev.key, ev.delivery, clipErr(cause)))
	}
	if err := h.record(wctx, ev, pipeline.EventStageFailed, LabelTriageErrored,
		map[string]any{"error": cause.Error(), "attempts": ev.delivery}); err != nil {
		return err
	}
	ev.log.Error().Err(cause).Msg("triage failed on its last attempt: " + LabelTriageErrored)
	h.forget(ev)
	return fmt.Errorf("triage of %s failed %d times: %w", ev.key, ev.delivery, cause)
}

// downstreamEvent builds the downstream request: the incoming Task with its unknown
// fields, metadata extended with the triage state (jira_issue, target_branch,
// triage_result, and the runner's extra fields), attempts back at 0.
func (h *handler) downstreamEvent(ev *event, res Result) (*message.Message, error) {
	t := ev.task
	t.Metadata = maps.Clone(ev.task.Metadata)
	if t.Metadata == nil {
		t.Metadata = map[string]json.RawMessage{}
	}
	for k, v := range res.Extra {
		t.Metadata[k] = v
	}
	data := map[string]json.RawMessage{}
	if len(res.Data) > 0 && string(res.Data) != "null" {
		if err := json.Unmarshal(res.Data, &data); err != nil {
			return nil, fmt.Errorf("triage result data: %w", err)
		}
	}
	if _, ok := data["jira_issue"]; !ok {
		data["jira_issue"], _ = json.Marshal(ev.key)
	}
	if err := t.Set("jira_issue", ev.key); err != nil {
		return nil, err
	}
	if err := t.Set("target_branch", res.TargetBranch); err != nil {
		return nil, err
	}
	if err := t.Set("triage_result", map[string]any{"resolution": res.Resolution, "data": data}); err != nil {
		return nil, err
	}
	t.Attempts = 0
	t.UserTriggered = ev.userTriggered
	return pipeline.NewEvent(pipeline.RequestedEvent(res.Resolution), ev.key, t, ev.msg)
}

// ---- rebase, backport, rebuild ----

// errCleanFailure marks a runner's {"success": false}.
var errCleanFailure = errors.New("agent reported failure")

func (h *handler) downstream(msg *message.Message) error {
	ctx := msg.Context()
	ev, err := h.begin(msg)
	if err != nil {
		return err
	}
	p := ev.p
	agent := h.cfg.Agent
	if p.result == nil {
		res, err := h.run(ctx, ev)
		if err == nil && !res.Success {
			reason := res.Error
			if reason == "" {
				reason = "no reason given"
			}
			err = fmt.Errorf("%s of %s: %w: %s", agent, ev.key, errCleanFailure, reason)
		}
		if err != nil {
			return h.downstreamFailed(ctx, ev, err)
		}
		p.result = &res
	}
	res := *p.result
	done := DoneLabel(agent)
	if !p.labelled {
		if err := h.setLabels(ctx, ev, []string{done}, []string{TriagedLabel(agent), FailedLabel(agent), ErroredLabel(agent)}); err != nil {
			return h.jiraErr(ctx, ev, "write "+done, err)
		}
		p.labelled = true
	}
	detail := map[string]any{"label": done, "merge_request_url": res.MergeRequestURL,
		"target_branch": ev.task.Str("target_branch"), "branch": h.cfg.Branch}
	if err := h.record(ctx, ev, pipeline.EventStageDone, done, detail); err != nil {
		return err
	}
	ev.log.Info().Str("label", done).Str("merge_request_url", res.MergeRequestURL).Msg(agent + " done")
	h.forget(ev)
	return nil
}

func (h *handler) downstreamFailed(ctx context.Context, ev *event, cause error) error {
	agent := h.cfg.Agent
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%s of %s interrupted: %w: %w", agent, ev.key, a, cause)
	}
	if !ev.last {
		// Unlike upstream, ymir_triaged_<agent> stays until the last attempt: it is the
		// issue's only in-flight marker (upstream weak point 11).
		if errors.Is(cause, errCleanFailure) && ev.userTriggered {
			if err := h.setLabels(ctx, ev, []string{FailedLabel(agent)}, nil); err != nil {
				ev.log.Warn().Err(err).Msg("could not write " + FailedLabel(agent) + " (not critical)")
			}
		}
		ev.log.Warn().Err(cause).Int("max_retries", h.cfg.MaxRetries).Msg(agent + " failed; it will be retried")
		return cause
	}
	wctx, cancel := writable(ctx)
	defer cancel()
	errored := ErroredLabel(agent)
	if !ev.p.labelled {
		if err := h.setLabels(wctx, ev, []string{errored}, []string{TriagedLabel(agent), FailedLabel(agent)}); err != nil {
			return h.jiraErr(wctx, ev, "write "+errored, err)
		}
		ev.p.labelled = true
	}
	if ev.userTriggered {
		h.comment(wctx, ev, fmt.Sprintf("ymirflow: %s of %s failed %d times: %s", agent, ev.key, ev.delivery, clipErr(cause)))
	}
	if err := h.record(wctx, ev, pipeline.EventStageFailed, errored,
		map[string]any{"error": cause.Error(), "attempts": ev.delivery, "branch": h.cfg.Branch}); err != nil {
		return err
	}
	ev.log.Error().Err(cause).Msg(agent + " failed on its last attempt: " + errored)
	h.forget(ev)
	return fmt.Errorf("%s of %s failed %d times: %w", agent, ev.key, ev.delivery, cause)
}

// ---- shared steps ----

func (h *handler) run(ctx context.Context, ev *event) (Result, error) {
	if err := aborted(ctx); err != nil {
		return Result{}, err
	}
	req := RunRequest{
		Agent: h.cfg.Agent, Branch: h.cfg.Branch, IssueKey: ev.key, Fence: ev.fence, Attempt: ev.delivery,
		MessageID: pipeline.EntryID(ev.msg), Stream: pipeline.EntryStream(ev.msg), UserTriggered: ev.userTriggered,
		Payload: ev.msg.Payload, Task: ev.task,
	}
	start := h.now()
	res, err := h.cfg.Runner.Run(ctx, req)
	if err != nil {
		return Result{}, err
	}
	if a := aborted(ctx); a != nil {
		return Result{}, fmt.Errorf("runner result discarded: %w", a)
	}
	if h.cfg.Agent == "triage" && !slices.Contains(Resolutions, res.Resolution) {
		return Result{}, fmt.Errorf("%w: unknown resolution %q", ErrBadOutput, res.Resolution)
	}
	ev.log.Debug().Dur("took", h.now().Sub(start)).Msg("runner returned")
	return res, nil
}

func (h *handler) readIssue(ctx context.Context, key string) (labels []string, status string, known bool, err error) {
	if h.cfg.Jira == nil {
		return nil, "", false, nil
	}
	is, err := h.cfg.Jira.GetIssue(ctx, key, []string{"labels", "status"})
	if err != nil {
		return nil, "", false, err
	}
	return is.Fields.Labels, is.Fields.Status.Name, true, nil
}

func (h *handler) setLabels(ctx context.Context, ev *event, add, remove []string) error {
	remove = slices.DeleteFunc(slices.Clone(remove), func(l string) bool { return slices.Contains(add, l) })
	if len(add) == 0 && len(remove) == 0 {
		return nil
	}
	if h.cfg.Jira == nil || h.cfg.DryRun {
		ev.log.Info().Strs("add", add).Strs("remove", remove).Bool("dry_run", true).Msg("jira labels not written (dry run)")
		return nil
	}
	if err := aborted(ctx); err != nil {
		return err
	}
	if err := h.cfg.Jira.UpdateLabels(ctx, ev.key, add, remove); err != nil {
		return err
	}
	ev.log.Info().Strs("add", add).Strs("remove", remove).Msg("jira labels written")
	return nil
}

// comment posts a comment; comments are best effort.
func (h *handler) comment(ctx context.Context, ev *event, body string) {
	if h.cfg.Jira == nil || h.cfg.DryRun {
		ev.log.Info().Str("comment", body).Bool("dry_run", true).Msg("jira comment not posted (dry run)")
		return
	}
	if err := h.cfg.Jira.AddComment(ctx, ev.key, body); err != nil {
		ev.log.Warn().Err(err).Msg("could not post a jira comment (not critical)")
	}
}

func (h *handler) record(ctx context.Context, ev *event, eventType, outcome string, detail any) error {
	rec := pipeline.RecordFor(ev.msg, h.cfg.Agent, eventType)
	rec.IssueKey = ev.key
	rec.Outcome = outcome
	if detail != nil {
		b, err := json.Marshal(detail)
		if err != nil {
			return err
		}
		rec.Detail = string(b)
	}
	if _, err := h.cfg.Results.Add(ctx, rec); err != nil {
		return h.redisErr(ctx, ev, "record the outcome", err)
	}
	return nil
}

// ---- errors ----

// retryLater marks an error that is not the event's fault (Jira or Redis unavailable)
// once the event's attempts are used up: it matches lockmw.ErrTransient, so the
// pipeline leaves the entry pending and redelivers it (nack) instead of dead-lettering
// it. Its message does not claim that Redis is down.
type retryLater struct{ err error }

func (e *retryLater) Error() string   { return e.err.Error() + " (event left pending for redelivery)" }
func (e *retryLater) Unwrap() []error { return []error{e.err, lockmw.ErrTransient} }

// jiraErr classifies a failed Jira call. An interrupted call returns the interruption;
// a missing issue is a bad event (dead-lettered at once); an outage (429, 5xx, network,
// and 401/403, which an operator must fix) is retried with backoff by the pipeline and,
// once the attempts are used up, left pending for redelivery instead of dead-lettered.
func (h *handler) jiraErr(ctx context.Context, ev *event, what string, err error) error {
	wrapped := fmt.Errorf("%s of %s: jira: %s: %w", h.cfg.Agent, ev.key, what, err)
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%w: %w", wrapped, a)
	}
	if errors.Is(err, jira.ErrNotFound) {
		return fmt.Errorf("%w: %w", pipeline.ErrBadEvent, wrapped)
	}
	transient := true
	var he *jira.HTTPError
	if errors.As(err, &he) {
		transient = he.Retryable() || he.StatusCode == http.StatusUnauthorized || he.StatusCode == http.StatusForbidden
	}
	if transient && ev.last {
		ev.log.Error().Err(err).Msg("jira unavailable on the last attempt; the event stays pending and is redelivered")
		return &retryLater{wrapped}
	}
	ev.log.Warn().Err(err).Msg("jira call failed")
	return wrapped
}

// redisErr classifies a failed Redis write (publish, results): a lost lease or an
// interruption passes through (the pipeline redelivers), anything else is retried and,
// once the attempts are used up, left pending.
func (h *handler) redisErr(ctx context.Context, ev *event, what string, err error) error {
	wrapped := fmt.Errorf("%s of %s: %s: %w", h.cfg.Agent, ev.key, what, err)
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%w: %w", wrapped, a)
	}
	if errors.Is(err, lockmw.ErrLeaseLost) {
		ev.log.Error().Err(err).Msg("fenced write refused: the lease is lost")
		return wrapped
	}
	if ev.last {
		return &retryLater{wrapped}
	}
	return wrapped
}

// aborted returns why ctx ended when it ended because the lease was lost or the worker
// is shutting down (the pipeline then redelivers the event), nil otherwise. A handler
// timeout is not an abort: it is a failed attempt.
func aborted(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(ctx)
	if errors.Is(cause, context.DeadlineExceeded) {
		return nil
	}
	if errors.Is(cause, context.Canceled) || errors.Is(cause, lockmw.ErrLeaseLost) {
		return cause
	}
	// Other lease causes (unproven, max hold): not lockmw.ErrLeaseLost, but the pipeline
	// must redeliver; lockmw sees the lease's end itself and says so.
	return fmt.Errorf("%w: %w", context.Canceled, cause)
}

// writable returns a context for the last attempt's bookkeeping writes: ctx, or, when
// only a handler timeout ended ctx, a short one detached from it.
func writable(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

func ymirLabels(labels []string) []string {
	var out []string
	for _, l := range labels {
		if strings.HasPrefix(l, LabelPrefix) {
			out = append(out, l)
		}
	}
	return out
}

func rawOrNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 {
		return json.RawMessage("null")
	}
	return r
}

func errorDetails(data json.RawMessage) string {
	var d struct {
		Details string `json:"details"`
	}
	if json.Unmarshal(data, &d) == nil && d.Details != "" {
		return d.Details
	}
	if len(data) == 0 {
		return "no details"
	}
	return string(data)
}

func clipErr(err error) string {
	s := err.Error()
	if len(s) > 1000 {
		s = s[:1000] + "…"
	}
	return s
}
