package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata keys of the envelope (docs/architecture.md, "The envelope"). The lock
// middleware reads MetaIssueKey and writes MetaFence under the same names.
const (
	MetaIssueKey      = "issue_key"
	MetaEventType     = "event_type"
	MetaSchemaVersion = "schema_version"
	MetaCorrelationID = "correlation_id"
	MetaCausationID   = "causation_id"
	MetaAttempt       = "attempt"
	MetaUserTriggered = "user_triggered"
	MetaReplayOf      = "replay_of"
	MetaFence         = "fence"
)

// SchemaVersion is the envelope version this build writes and accepts.
const SchemaVersion = "1"

// Event types.
const (
	TriageRequested   = "triage.requested"
	RebaseRequested   = "rebase.requested"
	BackportRequested = "backport.requested"
	RebuildRequested  = "rebuild.requested"
	StageDone         = "stage.done"
	StageFailed       = "stage.failed"
	LockDropped       = "lock.dropped"
	LockCoalesced     = "lock.coalesced"
	// LockDelivered: the event met a held lease and was appended to its mailbox
	// (policy deliver). FollowupDelivered and FollowupRolled record each follow-up's
	// fate: acknowledged by the live run it was delivered to, or handed to a run in
	// its Task JSON ("followups") and accounted for when that run ended.
	LockDelivered = "lock.delivered"
	// LockSuperseded: the event lost to a newer one for its issue (policy supersede):
	// its run, or its wait to run, was cancelled when the newer event took the lease
	// over (cancelled true), or it met the newer event's run (cancelled false). It
	// names the newer entry (holder_message_id) and its fence.
	LockSuperseded = "lock.superseded"
	// LockWaited: the event met a held lease and joined its key's line (policy wait):
	// acked, it runs as a copy (metadata waited_from names it) when a release hands the
	// key to it. It names its place in the line (position) and when the line's head
	// joined (oldest_waiting_since).
	LockWaited        = "lock.waited"
	FollowupDelivered = "followup.delivered"
	FollowupRolled    = "followup.rolled"
	Dead              = "dead"
	// CommentCreated is a maintainer's Jira comment on an issue that a stage's run
	// holds, published by the webhook to that run's stream as a follow-up: the lock
	// middleware's busy policy for it decides its fate (deliver: into the run's
	// mailbox; drop: a lock.dropped record). Its metadata carries the comment
	// (MetaCommentAuthor, MetaCommentBody, MetaCommentID) and its payload is the held
	// run's own Task, so that when it meets no live run (the run ended meanwhile, or the
	// deliver policy's release starts the next run with it) it runs as that stage's
	// request. Every agent accepts it (Validate).
	CommentCreated = "comment.created"
)

// Metadata the delay policy writes on the event it re-queues (its delayed set is
// internal/delayq's).
const (
	// MetaDelays counts how often the event was delayed (the policy doubles its wait
	// each time).
	MetaDelays = "delays"
	// MetaDelayedFrom is the stream id of the entry it was delayed from.
	MetaDelayedFrom = "delayed_from"
)

// LockDelayed is the results stream record of an event re-queued by the delay policy.
const LockDelayed = "lock.delayed"

// Metadata keys of a CommentCreated event: who wrote the comment (a Jira account id or
// user name), its text (redacted and bounded by the webhook) and its Jira id.
const (
	MetaCommentAuthor = "comment_author"
	MetaCommentBody   = "comment_body"
	MetaCommentID     = "comment_id"
)

// accepts reports whether agent runs events of eventType: its own request type
// (RequestedEvent) and CommentCreated. Any other type is a bad event for it.
func accepts(agent, eventType string) bool {
	return eventType == RequestedEvent(agent) || eventType == CommentCreated
}

// RequestedEvent is the event type that asks agent to work.
func RequestedEvent(agent string) string { return agent + ".requested" }

// WorkTypes are the event types some worker runs: each agent's request, in pipeline
// order, then CommentCreated. A busy-policy table may name only these; any other type
// is a bad event for every agent, so a rule for it would never apply.
func WorkTypes() []string {
	types := make([]string, 0, len(Agents)+1)
	for _, a := range Agents {
		types = append(types, RequestedEvent(a))
	}
	return append(types, CommentCreated)
}

// ErrBadEvent marks an event that can never succeed (not JSON, no or invalid issue key,
// unknown schema version or event type): it is dead-lettered at once, never retried.
var ErrBadEvent = errors.New("bad event")

// ErrOutcomeRecorded marks a handler's failure whose terminal record (stage.failed) is
// written already: retrying the handler cannot change the event's outcome, only
// dead-lettering it can. A redelivery of such an event (its dead letter or ack failed)
// returns it again without running anything.
var ErrOutcomeRecorded = errors.New("outcome recorded")

// Task is the Python system's task JSON, kept field for field so producers written for
// it keep working: {"metadata": {...}, "attempts": 0, "user_triggered": false}.
// Unknown fields, at the top and inside metadata, survive a decode/encode round trip.
type Task struct {
	Metadata      map[string]json.RawMessage
	Attempts      int
	UserTriggered bool
	extra         map[string]json.RawMessage
}

// ParseTask decodes a Task payload.
func ParseTask(payload []byte) (Task, error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(payload, &all); err != nil {
		return Task{}, fmt.Errorf("%w: payload is not a JSON object: %w", ErrBadEvent, err)
	}
	t := Task{extra: all}
	if raw, ok := all["metadata"]; ok {
		if err := json.Unmarshal(raw, &t.Metadata); err != nil {
			return Task{}, fmt.Errorf("%w: metadata is not an object: %w", ErrBadEvent, err)
		}
	}
	if raw, ok := all["attempts"]; ok {
		_ = json.Unmarshal(raw, &t.Attempts)
	}
	if raw, ok := all["user_triggered"]; ok {
		_ = json.Unmarshal(raw, &t.UserTriggered)
	}
	delete(all, "metadata")
	delete(all, "attempts")
	delete(all, "user_triggered")
	if t.Metadata == nil {
		t.Metadata = map[string]json.RawMessage{}
	}
	return t, nil
}

// MarshalJSON encodes the task with its unknown fields.
func (t Task) MarshalJSON() ([]byte, error) {
	out := make(map[string]any, len(t.extra)+3)
	for k, v := range t.extra {
		out[k] = v
	}
	md := t.Metadata
	if md == nil {
		md = map[string]json.RawMessage{}
	}
	out["metadata"] = md
	out["attempts"] = t.Attempts
	out["user_triggered"] = t.UserTriggered
	return json.Marshal(out)
}

// Str returns metadata[key] as a string ("" when absent or not a string).
func (t Task) Str(key string) string {
	var s string
	if raw, ok := t.Metadata[key]; ok {
		_ = json.Unmarshal(raw, &s)
	}
	return s
}

// Set stores v as metadata[key].
func (t *Task) Set(key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if t.Metadata == nil {
		t.Metadata = map[string]json.RawMessage{}
	}
	t.Metadata[key] = raw
	return nil
}

// IssueKey is the task's issue: metadata.issue (triage) or metadata.jira_issue.
func (t Task) IssueKey() string {
	if k := t.Str("issue"); k != "" {
		return k
	}
	return t.Str("jira_issue")
}

// New builds a message for eventType about issueKey. When cause is not nil, the
// new event keeps its correlation id and names it as causation.
func New(eventType, issueKey string, task Task, cause *message.Message) (*message.Message, error) {
	payload, err := json.Marshal(task)
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(MetaEventType, eventType)
	msg.Metadata.Set(MetaIssueKey, issueKey)
	msg.Metadata.Set(MetaSchemaVersion, SchemaVersion)
	msg.Metadata.Set(MetaAttempt, "0")
	msg.Metadata.Set(MetaUserTriggered, strconv.FormatBool(task.UserTriggered))
	if cause != nil {
		msg.Metadata.Set(MetaCorrelationID, cause.Metadata.Get(MetaCorrelationID))
		msg.Metadata.Set(MetaCausationID, cause.UUID)
	}
	if msg.Metadata.Get(MetaCorrelationID) == "" {
		msg.Metadata.Set(MetaCorrelationID, watermill.NewUUID())
	}
	return msg, nil
}

// Canonical turns a raw issue key into its canonical form, or errs for a key that is
// not one (the lease's key canonicalisation, e.g. a Locker's Canonicalize method).
type Canonical func(raw string) (string, error)

// Validate checks an event for agent and returns its canonical issue key (canonical
// makes it), or an error wrapping ErrBadEvent (the bad events of docs/architecture.md,
// "Bad input"). Events written by the Python producers carry no envelope metadata;
// they are accepted as the agent's request type.
func Validate(msg *message.Message, agent string, canonical Canonical) (string, error) {
	if reason := msg.Metadata.Get(metaBad); reason != "" {
		return "", fmt.Errorf("%w: %s", ErrBadEvent, reason)
	}
	if v := msg.Metadata.Get(MetaSchemaVersion); v != "" && v != SchemaVersion {
		return "", fmt.Errorf("%w: unknown schema_version %q (this build reads %s)", ErrBadEvent, v, SchemaVersion)
	}
	if et := msg.Metadata.Get(MetaEventType); et != "" && !accepts(agent, et) {
		return "", fmt.Errorf("%w: event_type %q is not for agent %s (want %s)", ErrBadEvent, et, agent, RequestedEvent(agent))
	}
	raw := msg.Metadata.Get(MetaIssueKey)
	if raw != "" {
		// The envelope names the issue: only check that the payload is a JSON object,
		// without decoding it (this runs for every event).
		if !isJSONObject(msg.Payload) {
			return "", fmt.Errorf("%w: payload is not a JSON object", ErrBadEvent)
		}
	} else {
		task, err := ParseTask(msg.Payload)
		if err != nil {
			return "", err
		}
		raw = task.IssueKey()
	}
	if raw == "" {
		return "", fmt.Errorf("%w: no issue key in metadata or payload", ErrBadEvent)
	}
	key, err := canonical(raw)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	msg.Metadata.Set(MetaIssueKey, key)
	return key, nil
}

func isJSONObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return json.Valid(b)
		}
		return false
	}
	return false
}

// Runnable returns the test of a raw stream entry for agent: an entry is runnable when
// it decodes (Marshaller, with the bound maxEventBytes) into a message that Validate
// accepts, exactly the test a dead-letter path applies before the lease. The common
// entry (readable fields, the issue key in m:issue_key) is decided on its raw fields
// without decoding it; anything else takes the full decode, so the two can never
// disagree.
func Runnable(agent string, canonical Canonical, maxEventBytes int) func(values map[string]any) bool {
	m := Marshaller{MaxEventBytes: maxEventBytes}
	limit := orMaxEventBytes(maxEventBytes)
	full := func(values map[string]any) bool {
		msg, _ := m.Unmarshal(values)
		_, err := Validate(msg, agent, canonical)
		return err == nil
	}
	return func(values map[string]any) bool {
		str := func(k string) (string, bool) { v, ok := values[k].(string); return v, ok }
		uuid, _ := str(fieldUUID)
		payload, hasPayload := str(fieldPayload)
		key, _ := str(metaPrefix + MetaIssueKey)
		sv, _ := str(metaPrefix + MetaSchemaVersion)
		et, _ := str(metaPrefix + MetaEventType)
		_, msgpack := values[fieldMetadata]
		if uuid == "" || !hasPayload || key == "" || msgpack || (sv != "" && sv != SchemaVersion) || (et != "" && !accepts(agent, et)) {
			return full(values)
		}
		if size, fields := entrySize(values); size > limit || fields > MaxEventFields {
			return false // what Unmarshal marks oversized: dead-lettered
		}
		if _, err := canonical(key); err != nil || !isJSONObject([]byte(payload)) {
			return full(values)
		}
		return true
	}
}
