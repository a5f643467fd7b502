package agentctl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// Answers of BeginAsk (Ask.Status).
const (
	AskPost   = "post"  // ask: post the comment (after looking for an earlier post), then Asked
	AskAsked  = "asked" // asked at this budget level already: nothing to post
	AskBusy   = "busy"  // another run is asking, its lease held and its deadline ahead
	askMarker = "ymir-budget-ask"
)

// Ask is BeginAsk's answer: what to do, and the budget level (the raises so far, in
// micro-USD) the ask is about.
type Ask struct {
	Status string
	Level  int64
}

// Marker is the text the comment asking for more budget at this level carries, by
// which a later ask finds it (a post whose "asked" mark was lost with its process).
func (a Ask) Marker(issue string) string {
	return "{{" + askMarker + " " + issue + " " + strconv.FormatInt(a.Level, 10) + "}}"
}

// BeginAsk starts the ask for more budget of issue at its current level (once per
// level: after an approval, a new exhaustion asks again), for run, which holds its
// lease. The ask is in three steps: BeginAsk marks it "asking" until deadline, the
// caller posts the comment (unless it finds Ask.Marker in the issue's comments
// already), then Asked marks it done. An ask whose asker died (its lease gone) or
// outlived its deadline is taken over by the next one; an "asked" level is never asked
// again. So the comment is posted at least once per level; twice only when the first
// poster was slow past its deadline with its lease held, and its comment not yet
// visible when the second looked.
func (l *Ledger) BeginAsk(ctx context.Context, issue string, run Run, deadline time.Duration) (Ask, error) {
	res, err := l.ask.Run(ctx, l.rdb, []string{l.key(issue, "ledger")}, run.LockKey, run.Token,
		l.now().UnixMilli(), deadline.Milliseconds()).Slice()
	if err != nil {
		return Ask{}, fmt.Errorf("agentctl: mark the budget request of %s: %w", issue, err)
	}
	return Ask{Status: res[0].(string), Level: res[1].(int64)}, nil
}

// Asked marks issue's ask at a's level done: the comment is posted.
func (l *Ledger) Asked(ctx context.Context, issue string, a Ask) error {
	err := l.rdb.HSet(ctx, l.key(issue, "ledger"), "ask:"+strconv.FormatInt(a.Level, 10), AskAsked).Err()
	if err != nil {
		return fmt.Errorf("agentctl: mark the budget request of %s asked: %w", issue, err)
	}
	return nil
}

// ParkedOnceTTL is how long the publish of a resumed request is recognised as a
// repeat (internal/xonce's marker, keyed by the parked request's id). A resume that
// published and then failed before forgetting the request (a crash, a lost
// connection) is finished by the next one within that time, publishing nothing twice.
const ParkedOnceTTL = 7 * 24 * time.Hour

// ErrParkedInvalid says a parked request is not a valid request (a PublishParked wraps
// it): ResumeParked forgets it rather than keep it forever.
var ErrParkedInvalid = errors.New("agentctl: the parked request is not a valid request")

// Parked is a request whose run ended for its budget, kept to be published again when
// the budget is raised.
type Parked struct {
	// ID names this parking (set by Park): the resume's publish is idempotent by it.
	ID        string `json:"id"`
	Agent     string `json:"agent"`
	Stream    string `json:"stream"`
	EventType string `json:"event_type"`
	Payload   []byte `json:"payload"`
}

// OnceID is the append id (xonce) the publish of p must use: a repeat adds nothing.
func (p Parked) OnceID() string { return "parked-" + p.ID }

// Park keeps p until issue's budget is raised (one per agent: the newest), under a new
// ID.
func (l *Ledger) Park(ctx context.Context, issue string, p Parked) error {
	p.ID = xonce.NewID()
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := l.rdb.HSet(ctx, l.key(issue, "parked"), p.Agent, b).Err(); err != nil {
		return fmt.Errorf("agentctl: park %s of %s: %w", p.Agent, issue, err)
	}
	return nil
}

// PublishParked publishes p to p.Stream with the append id p.OnceID() (and a TTL of
// ParkedOnceTTL), so that publishing it twice adds one entry, and returns the entry's
// id. An error wrapping ErrParkedInvalid drops p.
type PublishParked func(ctx context.Context, p Parked) (string, error)

// Resumed is one parked request ResumeParked handled.
type Resumed struct {
	Parked
	EntryID string // the entry published; "" when dropped
	Dropped error  // why it was dropped (ErrParkedInvalid), not published
}

// ResumeParked publishes issue's parked requests again with publish and forgets each
// one after its publish succeeded: two steps, publish first. A failure between them
// (a crash, Redis unreachable) leaves the request parked, never lost; the next resume
// (the approval's redelivery, the next approval) publishes it again, and the append id
// (Parked.OnceID) makes that publish add nothing when the first one went through
// (within ParkedOnceTTL). The forget removes the request only if it is still the one
// published: one parked again meanwhile (a newer run of the agent) stays. It stops at
// the first failure and returns what it did.
func (l *Ledger) ResumeParked(ctx context.Context, issue string, publish PublishParked) ([]Resumed, error) {
	key := l.key(issue, "parked")
	all, err := l.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("agentctl: read the parked requests of %s: %w", issue, err)
	}
	var out []Resumed
	for agent, raw := range all {
		r := Resumed{}
		err = json.Unmarshal([]byte(raw), &r.Parked)
		if r.ID == "" {
			// Parked before requests had an id: named by their content.
			sum := sha256.Sum256([]byte(raw))
			r.ID = hex.EncodeToString(sum[:12])
		}
		if err != nil {
			r.Parked.Agent, r.Dropped = agent, fmt.Errorf("%w: %w", ErrParkedInvalid, err)
		} else if r.EntryID, err = publish(ctx, r.Parked); errors.Is(err, ErrParkedInvalid) {
			r.Dropped = err
		} else if err != nil {
			return out, fmt.Errorf("agentctl: publish the parked %s request of %s: %w", agent, issue, err)
		}
		if err := l.forget.Run(ctx, l.rdb, []string{key}, agent, raw).Err(); err != nil {
			return out, fmt.Errorf("agentctl: forget the parked %s request of %s (published: the next resume finishes it): %w", agent, issue, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// ParkedRequests returns issue's parked requests (nothing taken).
func (l *Ledger) ParkedRequests(ctx context.Context, issue string) ([]Parked, error) {
	all, err := l.rdb.HGetAll(ctx, l.key(issue, "parked")).Result()
	if err != nil {
		return nil, fmt.Errorf("agentctl: read the parked requests of %s: %w", issue, err)
	}
	out := make([]Parked, 0, len(all))
	for _, v := range all {
		var p Parked
		if json.Unmarshal([]byte(v), &p) == nil {
			out = append(out, p)
		}
	}
	return out, nil
}
