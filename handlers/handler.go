package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/agentctl"
	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/runners"
)

// Config configures one agent's handler.
type Config struct {
	// Agent is triage, rebase, backport or rebuild; Branch (c9s, c10s) is required for
	// every agent but triage.
	Agent, Branch string
	Runner        runners.Runner
	// Jira reads labels and status and writes labels and comments. Nil: no Jira at all
	// (the agent-side dedup is skipped and every write is logged instead).
	Jira JiraAPI
	// Publisher publishes triage's downstream requests (required for triage). Inside a
	// lock middleware handler its publishes are fenced.
	Publisher *event.Publisher
	// Results receives every terminal outcome.
	Results  *event.Results
	Topology event.Topology
	// MaxRetries is the router's number of attempts (RouterConfig.MaxRetries); the last
	// one writes the _errored label. Default pipeline.DefaultMaxRetries.
	MaxRetries int
	Logger     zerolog.Logger
	// DryRun logs Jira writes (labels, comments) instead of sending them; reads are sent.
	DryRun bool
	// Redactor takes secrets out of Jira comments (nil: nothing to take out).
	Redactor *redact.Redactor
	// Fences counts Jira writes refused because the lease was lost, and writes found to
	// have raced a lease loss (pipeline.Metrics implements it). Nil: not counted.
	Fences FenceObserver
	// TracerProvider traces the runner, each Jira write (fenced or refused) and the
	// outcome record, as children of the delivery's span (docs/architecture.md,
	// "Tracing"). Nil: no spans.
	TracerProvider trace.TracerProvider
	// Mailbox: the router's policy is lockmw.Deliver. Each run then gets the follow-ups
	// earlier runs left in its lease's mailbox in its Task JSON ("followups") and the
	// new ones while it runs (RunRequest.Mailbox); at its end those it was given and
	// those it acknowledged are removed from the mailbox and recorded
	// (followup.rolled, followup.delivered). Default: false.
	Mailbox bool
	// MailboxDepth is the mailbox's bound (the router's); a run reads at most this
	// many earlier follow-ups. Default: lease.DefaultMailboxDepth.
	MailboxDepth int64
	// EndedCache is how many ended events the handler remembers in memory, with what
	// each returned. Only a cache: whether an event ended is read from its outcome
	// record in Redis at every delivery, so a redelivery settles on any worker.
	// Default: 1024.
	EndedCache int
	// Ledger, when set, gives each run under a lease its control channel (usage,
	// reserve, checkpoint, permit: package agentctl, YMIR_CONTROL_FD) and the issue
	// agent's last checkpoint in its Task JSON ("checkpoint"); a run that stops for its
	// budget ends with the outcome budget.exhausted. Default: nil, no channel.
	Ledger *agentctl.Ledger
	// Control configures each run's channel (permits, limits, metrics); its Logger is
	// the event's.
	Control agentctl.ChannelOptions
}

// FenceObserver counts fenced Jira writes made for an event (target: labels, comment).
type FenceObserver interface {
	// FencedWriteRefused: the lease was not ours when the write was about to be sent.
	FencedWriteRefused(agent, target string)
	// FencedWriteRaced: the lease was ours before the write and lost right after it, so
	// the write may have landed on a newer holder's state and the labels were converged.
	FencedWriteRaced(agent, target string)
}

type nopFences struct{}

func (nopFences) FencedWriteRefused(string, string) {}
func (nopFences) FencedWriteRaced(string, string)   {}

// New returns the handler of cfg.Agent, to be given to pipeline.RouterConfig.Handler.
func New(cfg Config) (message.NoPublishHandlerFunc, error) {
	if err := event.CheckAgent(cfg.Agent, cfg.Branch); err != nil {
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
	if cfg.Fences == nil {
		cfg.Fences = nopFences{}
	}
	if cfg.EndedCache <= 0 {
		cfg.EndedCache = defaultEndedCache
	}
	h := &handler{cfg: cfg, memo: map[string]*progress{}, ended: map[string]error{}, now: time.Now, tracer: event.Tracer(cfg.TracerProvider)}
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
	cfg    Config
	log    zerolog.Logger
	now    func() time.Time
	tracer trace.Tracer // nil: tracing off

	mu   sync.Mutex
	memo map[string]*progress
	// ended holds what the attempts that wrote a terminal record returned, for the
	// newest Config.EndedCache events: a redelivery (its ack or dead letter failed)
	// settles with that exact error. Only a cache: the outcome record in Redis says
	// whether an event ended. endedQ is their order, oldest first.
	ended  map[string]error
	endedQ []string
}

// progress remembers what one event's attempts have done already, so that a retry
// (after a runner failure, a Jira outage or a Redis error) neither re-runs the runner
// after it succeeded nor publishes the downstream request twice.
type progress struct {
	fence     int64 // lease of the current delivery
	base      int   // attempt number at which the current delivery started
	claimed   bool
	acked     bool
	result    *runners.Result
	ran       *ranRun // a run that returned, its follow-ups not yet accounted for
	published bool
	stream    string
	streamID  string
	labelled  bool
	unclaimed bool
	touched   time.Time
}

// defaultEndedCache bounds the events remembered as ended (Config.EndedCache).
const defaultEndedCache = 1024

// Memo bounds: entries of events that ended elsewhere (lease lost, then run by another
// worker) are dropped after memoTTL, and the table never grows past memoMax.
const (
	memoTTL = 24 * time.Hour
	memoMax = 10_000
)

// job is one attempt at one message.
type job struct {
	msg           *message.Message
	task          event.Task
	key           string
	memoKey       string
	p             *progress
	attempt       int // metadata attempt (1-based, over every delivery in this process)
	delivery      int // attempt within the current delivery (lease)
	last          bool
	ended         bool  // its terminal record is written: settle, do not run
	endErr        error // what the ended attempt returned (nil: done)
	userTriggered bool
	fence         int64
	log           zerolog.Logger
}

func (h *handler) begin(msg *message.Message) (*job, error) {
	task, err := event.ParseTask(msg.Payload)
	if err != nil {
		return nil, err
	}
	raw := msg.Metadata.Get(event.MetaIssueKey)
	if raw == "" {
		raw = task.IssueKey()
	}
	key, err := lease.Canonicalize(raw, lease.DefaultKeyPattern)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", event.ErrBadEvent, err)
	}
	ev := &job{msg: msg, task: task, key: key}
	ev.userTriggered = task.UserTriggered || msg.Metadata.Get(event.MetaUserTriggered) == "true"
	ev.attempt, _ = strconv.Atoi(msg.Metadata.Get(event.MetaAttempt))
	ev.attempt = max(ev.attempt, 1)
	if le, ok := lockmw.LeaseFrom(msg.Context()); ok {
		ev.fence = le.Fence()
	}
	ev.memoKey = event.EntryID(msg) + "|" + msg.UUID
	ev.log = h.log.With().Str("issue_key", key).Str("message_id", event.EntryID(msg)).
		Str("correlation_id", msg.Metadata.Get(event.MetaCorrelationID)).Logger()
	if ended, err := h.endedBefore(msg.Context(), ev); err != nil || ended {
		return ev, err
	}

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
		if h.cfg.Agent == "triage" && p.result == nil && p.ran == nil {
			p.claimed, p.labelled, p.unclaimed = false, false, false
		}
	}
	p.touched = now
	h.mu.Unlock()

	ev.p = p
	ev.delivery = ev.attempt - p.base + 1
	ev.last = ev.delivery >= h.cfg.MaxRetries
	ev.log = ev.log.With().Int64("fence", ev.fence).Int("attempt", ev.delivery).Logger()
	return ev, nil
}

// endedBefore reports whether ev's terminal record is in Redis already: its ack or
// dead letter failed, and this is its redelivery, on this worker or another, however
// many events later. The outcome record decides, never this process's memory, which
// only keeps the exact error the ended attempt returned. Then ev is marked ended (settle,
// do not run). A failed read fails the attempt (retried, then left pending) unless the
// memory knows the event ended here: running it blind could record a second outcome.
func (h *handler) endedBefore(ctx context.Context, ev *job) (bool, error) {
	h.mu.Lock()
	endErr, cached := h.ended[ev.memoKey]
	h.mu.Unlock()
	rec, found, err := h.cfg.Results.Recorded(ctx, h.outcomeOnce(ev.msg))
	switch {
	case err != nil && cached:
		ev.log.Warn().Err(err).Msg("cannot read the outcome recorded for a redelivered event; it stands")
	case err != nil:
		return false, h.outcomeReadErr(ctx, ev, err)
	case !found && cached:
		ev.log.Warn().Msg("delivered again after its outcome was recorded, and the record is gone from Redis (a failover lost it): running it again")
		h.mu.Lock()
		delete(h.ended, ev.memoKey)
		h.mu.Unlock()
		return false, nil
	case !found:
		return false, nil
	case !cached:
		endErr = outcomeErr(ev, rec)
	}
	h.mu.Lock()
	delete(h.memo, ev.memoKey)
	h.mu.Unlock()
	ev.ended, ev.endErr = true, endErr
	return true, nil
}

// outcomeReadErr is a failed read of an event's outcome record: retried like any
// Redis failure, and left pending once the attempts are used up.
func (h *handler) outcomeReadErr(ctx context.Context, ev *job, err error) error {
	wrapped := fmt.Errorf("%s of %s: read its outcome record: %w", h.cfg.Agent, ev.key, err)
	if a := aborted(ctx); a != nil {
		return fmt.Errorf("%w: %w", wrapped, a)
	}
	if ev.attempt >= h.cfg.MaxRetries {
		return &retryLater{wrapped}
	}
	return wrapped
}

// outcomeErr is what a redelivery of an event that another worker (or this one, long
// ago) ended returns: nil after stage.done; after stage.failed an error matching
// event.ErrOutcomeRecorded, so the event goes to the dead letter again. A record
// trimmed from the stream is taken as done: it was recorded, and ran.
func outcomeErr(ev *job, rec event.Record) error {
	if rec.EventType != event.StageFailed {
		return nil
	}
	var d struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal([]byte(rec.Detail), &d)
	return recorded{fmt.Errorf("%s of %s failed (recorded as %s): %s", rec.Agent, ev.key, rec.ID, d.Error)}
}

// outcomeOnce names an event's terminal record (Results.AddOnce): one per agent and
// stream entry, so no two workers record two outcomes of one entry.
func (h *handler) outcomeOnce(msg *message.Message) string {
	if id := event.EntryID(msg); id != "" {
		return "outcome-" + h.cfg.Agent + "-" + event.EntryStream(msg) + "-" + id
	}
	return "outcome-" + h.cfg.Agent + "-uuid-" + msg.UUID
}

// end forgets an event's progress once its terminal record is written, and
// remembers what its attempt returned (nil, or an error wrapping
// event.ErrOutcomeRecorded), which it returns.
func (h *handler) end(ev *job, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.memo, ev.memoKey)
	if _, ok := h.ended[ev.memoKey]; !ok {
		if len(h.endedQ) >= h.cfg.EndedCache {
			delete(h.ended, h.endedQ[0])
			h.endedQ = h.endedQ[1:]
		}
		h.endedQ = append(h.endedQ, ev.memoKey)
	}
	h.ended[ev.memoKey] = err
	return err
}

// recorded is a last attempt's failure whose stage.failed record is written: its text
// is the failure's, and it also matches event.ErrOutcomeRecorded, so the retry
// middleware leaves it to the dead letter.
type recorded struct{ error }

func (r recorded) Unwrap() []error { return []error{r.error, event.ErrOutcomeRecorded} }

// settle answers a delivery of an event that ended here already: its outcome stands.
func (h *handler) settle(ev *job) error {
	ev.log.Warn().Err(ev.endErr).Msg("delivered again after its outcome was recorded (its ack or dead letter failed); settled without a run")
	return ev.endErr
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
