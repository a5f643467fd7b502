package handlers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/ymirflow/ymirflow/internal/redact"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline"
	"github.com/ymirflow/ymirflow/pipeline/event"
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
	// ended holds the events whose terminal record this handler wrote, until it has
	// seen recentMax later ones: their ack or dead letter can still fail (a Redis
	// timeout), and the redelivery that follows must settle the event, not run it again
	// and record a second outcome. endedQ is their order, oldest first.
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
	published bool
	stream    string
	streamID  string
	labelled  bool
	unclaimed bool
	touched   time.Time
}

// endedMax bounds the events remembered as ended. A redelivery after a failed ack
// comes within seconds, after at most a few hundred other events of one worker.
const endedMax = 1024

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

	h.mu.Lock()
	if endErr, ok := h.ended[ev.memoKey]; ok {
		h.mu.Unlock()
		ev.log = h.log.With().Str("issue_key", key).Str("message_id", event.EntryID(msg)).
			Str("correlation_id", msg.Metadata.Get(event.MetaCorrelationID)).Logger()
		if h.outcomeStands(msg.Context(), ev) {
			ev.ended, ev.endErr = true, endErr
			return ev, nil
		}
		h.mu.Lock()
		delete(h.ended, ev.memoKey)
	}
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
	ev.log = h.log.With().Str("issue_key", key).Str("message_id", event.EntryID(msg)).
		Str("correlation_id", msg.Metadata.Get(event.MetaCorrelationID)).Int64("fence", ev.fence).
		Int("attempt", ev.delivery).Logger()
	return ev, nil
}

// end forgets an event's progress once its terminal record is written, and
// remembers what its attempt returned (nil, or an error wrapping
// event.ErrOutcomeRecorded), which it returns.
func (h *handler) end(ev *job, err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.memo, ev.memoKey)
	if _, ok := h.ended[ev.memoKey]; !ok {
		if len(h.endedQ) >= endedMax {
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

// outcomeStands reports whether the terminal record this handler wrote for ev is still
// in the results stream. Redis can forget what it acknowledged: a failover to a replica
// that had not received the record loses it (the ack after it too, so the event comes
// back). Then the event is run again, as if it had never ended here, rather than acked
// with no outcome. A failed read keeps the outcome (the ack that follows is as likely
// to fail, and the delivery after it asks again).
func (h *handler) outcomeStands(ctx context.Context, ev *job) bool {
	if h.cfg.Results == nil {
		return true
	}
	recs, err := h.cfg.Results.Outcomes(ctx, ev.key, 0)
	if err != nil {
		ev.log.Warn().Err(err).Msg("cannot read the outcome recorded for a redelivered event; it stands")
		return true
	}
	id := event.EntryID(ev.msg)
	for _, r := range recs {
		if r.MessageID == id && r.Agent == h.cfg.Agent {
			return true
		}
	}
	ev.log.Warn().Msg("delivered again after its outcome was recorded, and the record is gone from Redis (a failover lost it): running it again")
	return false
}

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
