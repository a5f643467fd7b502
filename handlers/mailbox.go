package handlers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/event"
	"github.com/ymirflow/ymirflow/lockmw"
	"github.com/ymirflow/ymirflow/lockmw/lease"
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
	// A republished copy (lockmw.MetaMailboxWake) stands for the mailbox: its comment is
	// there, or a run took it from there already.
	if own, ok := ownComment(ev.msg); ok && !lockmw.IsMailboxWake(ev.msg) && !slices.ContainsFunc(mr.earlier, func(f runners.Followup) bool {
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

// ranRun is a run that returned a result, kept in the event's progress until the
// follow-ups it was given and acknowledged are accounted for: a failure to account
// for them is retried on its own, never by running the agent again.
type ranRun struct {
	res       runners.Result
	followups []accounted
	unacked   int
}

// accounted is one follow-up a run accounted for: rolled into it (given at its start)
// or delivered (acknowledged while it ran).
type accounted struct {
	id, eventType string
	fields        map[string]string
}

// accountFor lists the follow-ups of a run that returned res: those it started with
// and those it acknowledged. The others stay in the mailbox and start the issue's next run.
func accountFor(mr *mailboxRun, res runners.Result) *ranRun {
	r := &ranRun{res: res}
	if mr == nil {
		return r
	}
	for _, f := range mr.earlier {
		r.followups = append(r.followups, accounted{id: f.ID, eventType: event.FollowupRolled, fields: f.Fields})
	}
	mr.live.mu.Lock()
	for _, id := range res.FollowupsAcked {
		r.followups = append(r.followups, accounted{id: id, eventType: event.FollowupDelivered, fields: mr.live.seen[id]})
	}
	mr.live.mu.Unlock()
	r.unacked = len(res.Delivered) - len(res.FollowupsAcked)
	return r
}

// closeMailbox accounts for a run's follow-ups: each gets its record, then they leave
// the mailbox. Records first: a failure between the two leaves a follow-up in the
// mailbox with its record, and whichever run accounts for it again (this event's retry,
// or the issue's next run on any worker) finds the record there (Results.AddOnce, one
// per follow-up), so no follow-up is lost or recorded twice. Safe to repeat.
func (h *handler) closeMailbox(ctx context.Context, ev *job, r *ranRun) error {
	if len(r.followups) == 0 {
		if r.unacked > 0 {
			ev.log.Info().Int("unacknowledged", r.unacked).Msg("follow-ups not acknowledged: they start the next run")
		}
		return nil
	}
	le, ok := lockmw.LeaseFrom(ctx)
	if !ok {
		return fmt.Errorf("%s of %s: account for the follow-ups: no lease", h.cfg.Agent, ev.key)
	}
	ids := make([]string, 0, len(r.followups))
	for _, f := range r.followups {
		detail := map[string]string{"followup_id": f.id}
		for _, k := range []string{"event_type", "message_id", "author", "comment_id"} {
			if v := f.fields[k]; v != "" {
				detail["followup_"+k] = v
			}
		}
		if err := h.recordOnce(ctx, ev, followupOnce(h.cfg.Agent, le, f.id), f.eventType, f.id, detail); err != nil {
			return err
		}
		ids = append(ids, f.id)
	}
	if _, err := le.MailboxDone(ctx, ids...); err != nil {
		return h.redisErr(ctx, ev, "account for the follow-ups", err)
	}
	ev.log.Info().Int("accounted", len(ids)).Int("unacknowledged", r.unacked).Msg("follow-ups accounted for")
	return nil
}

// followupOnce names a follow-up's record (Results.AddOnce): its mailbox entry, which
// is one per agent and lease key.
func followupOnce(agent string, le *lease.Lease, id string) string {
	return "followup-" + agent + "-" + le.Issue() + "-" + id
}
