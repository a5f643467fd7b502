package handlers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
	"github.com/ymirflow/ymirflow/pipeline/event"
	"github.com/ymirflow/ymirflow/runners"
)

// mailboxWait bounds one wait for new follow-ups: the feed notices a run's end within
// it, and a follow-up reaches the agent as soon as it is appended.
const mailboxWait = 250 * time.Millisecond

// leaseMailbox feeds a run the follow-ups appended to its lease's mailbox after the
// last one it saw.
type leaseMailbox struct {
	le    *lease.Lease
	after string
	mu    sync.Mutex
	seen  map[string]map[string]string // fields of the follow-ups fed, by id
}

// Next implements runners.Mailbox.
func (m *leaseMailbox) Next(ctx context.Context) ([]runners.Followup, error) {
	fs, err := m.le.WaitMailbox(ctx, m.after, mailboxWait)
	if err != nil || len(fs) == 0 {
		return nil, err
	}
	m.after = fs[len(fs)-1].ID
	m.mu.Lock()
	for _, f := range fs {
		m.seen[f.ID] = f.Fields
	}
	m.mu.Unlock()
	return toRunner(fs), nil
}

func toRunner(fs []lease.Followup) []runners.Followup {
	out := make([]runners.Followup, len(fs))
	for i, f := range fs {
		out[i] = runners.Followup{ID: f.ID, Fields: f.Fields}
	}
	return out
}

// mailboxRun is a run's part of the deliver policy: the follow-ups it starts with.
type mailboxRun struct {
	le      *lease.Lease
	earlier []runners.Followup
	live    *leaseMailbox
}

// openMailbox reads the follow-ups earlier runs left, puts them into req's Task JSON
// and gives req a feed of the new ones. Without the deliver policy or a lease it does
// nothing.
func (h *handler) openMailbox(ctx context.Context, ev *job, req *runners.RunRequest) (*mailboxRun, error) {
	if !h.cfg.Mailbox {
		return nil, nil
	}
	le, ok := lockmw.LeaseFrom(ctx)
	if !ok {
		return nil, nil
	}
	fs, err := le.Mailbox(ctx, "", h.cfg.MailboxDepth)
	if err != nil {
		return nil, h.redisErr(ctx, ev, "read the mailbox", err)
	}
	mr := &mailboxRun{le: le, earlier: toRunner(fs)}
	if own, ok := ownComment(ev.msg); ok && !slices.ContainsFunc(mr.earlier, func(f runners.Followup) bool {
		return f.Fields["comment_id"] == own.Fields["comment_id"]
	}) {
		// A maintainer's comment that met no live run (its run ended before a worker
		// read it) runs as the stage's request; its agent still gets the comment, as a
		// follow-up rolled into the run. When a release started this run for the comment
		// (it is in the mailbox), it is there once already.
		mr.earlier = append(mr.earlier, own)
	}
	payload, err := runners.WithFollowups(req.Payload, mr.earlier)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", event.ErrBadEvent, err)
	}
	req.Payload = payload
	after := "0-0"
	if len(fs) > 0 {
		after = fs[len(fs)-1].ID
	}
	mr.live = &leaseMailbox{le: le, after: after, seen: map[string]map[string]string{}}
	req.Mailbox = mr.live
	if len(fs) > 0 {
		ev.log.Info().Int("followups", len(fs)).Msg("run starts with follow-ups earlier runs left")
	}
	return mr, nil
}

// ownComment is the follow-up a comment.created event carries, as the mailbox would
// hold it (lockmw.FollowupOf), named by its own stream entry id; false for any other
// event or one read from no stream.
func ownComment(msg *message.Message) (runners.Followup, bool) {
	id := event.EntryID(msg)
	if msg.Metadata.Get(event.MetaEventType) != event.CommentCreated || msg.Metadata.Get(event.MetaCommentID) == "" || id == "" {
		return runners.Followup{}, false
	}
	fields := map[string]string{}
	for k, v := range lockmw.FollowupOf(msg, lockmw.Entry{Stream: event.EntryStream(msg), ID: id}) {
		fields[k] = fmt.Sprint(v)
	}
	return runners.Followup{ID: id, Fields: fields}, true
}

// closeMailbox accounts for the follow-ups of a run that returned a result: those it
// started with (rolled into it) and those it acknowledged (delivered) leave the
// mailbox and get a record each; the others stay and start the next run.
func (h *handler) closeMailbox(ctx context.Context, ev *job, mr *mailboxRun, res runners.Result) error {
	if mr == nil {
		return nil
	}
	ids := make([]string, 0, len(mr.earlier)+len(res.FollowupsAcked))
	for _, f := range mr.earlier {
		ids = append(ids, f.ID)
	}
	ids = append(ids, res.FollowupsAcked...)
	if len(ids) == 0 {
		if n := len(res.Delivered); n > 0 {
			ev.log.Info().Int("unacknowledged", n).Msg("follow-ups not acknowledged: they start the next run")
		}
		return nil
	}
	if _, err := mr.le.MailboxDone(ctx, ids...); err != nil {
		return h.redisErr(ctx, ev, "account for the follow-ups", err)
	}
	for i, id := range ids {
		eventType, fields := event.FollowupRolled, map[string]string(nil)
		if i < len(mr.earlier) {
			fields = mr.earlier[i].Fields
		} else {
			eventType = event.FollowupDelivered
			mr.live.mu.Lock()
			fields = mr.live.seen[id]
			mr.live.mu.Unlock()
		}
		detail := map[string]string{"followup_id": id}
		for _, k := range []string{"event_type", "message_id", "author", "comment_id"} {
			if v := fields[k]; v != "" {
				detail["followup_"+k] = v
			}
		}
		if err := h.record(ctx, ev, eventType, id, detail); err != nil {
			return err
		}
	}
	ev.log.Info().Int("rolled", len(mr.earlier)).Int("delivered", len(res.FollowupsAcked)).
		Int("unacknowledged", len(res.Delivered)-len(res.FollowupsAcked)).Msg("follow-ups accounted for")
	return nil
}
