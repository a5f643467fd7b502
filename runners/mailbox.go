package runners

import (
	"context"
	"encoding/json"
	"maps"
)

// Followup is one follow-up of a run (policy deliver): an event for the issue that
// arrived while the run held its lease, e.g. a maintainer's comment. The agent reads it
// as one JSON object: "id" and Fields (event_type, message_id, author, body,
// comment_id, at, ...).
type Followup struct {
	ID     string
	Fields map[string]string
}

// MarshalJSON is the follow-up as the agent reads it: Fields with "id".
func (f Followup) MarshalJSON() ([]byte, error) {
	m := make(map[string]string, len(f.Fields)+1)
	maps.Copy(m, f.Fields)
	m["id"] = f.ID
	return json.Marshal(m)
}

// Mailbox feeds a running agent its follow-ups (RunRequest.Mailbox).
type Mailbox interface {
	// Next returns the follow-ups that arrived after those it returned before, in
	// their order, waiting a short while (well under a second) for one; none when
	// nothing came. The runner calls it in a loop while the agent runs.
	Next(ctx context.Context) ([]Followup, error)
}

// WithFollowups returns the Task JSON payload with "followups" set to fs (the
// follow-ups earlier runs did not account for), other fields untouched.
func WithFollowups(payload []byte, fs []Followup) ([]byte, error) {
	var task map[string]json.RawMessage
	if err := json.Unmarshal(payload, &task); err != nil {
		return nil, err
	}
	if fs == nil {
		fs = []Followup{}
	}
	b, err := json.Marshal(fs)
	if err != nil {
		return nil, err
	}
	task["followups"] = b
	return json.Marshal(task)
}
