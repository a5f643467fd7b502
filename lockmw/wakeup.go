package lockmw

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ymirflow/ymirflow/lockmw/lease"
)

// MetaMailboxWake marks an event kept as a lease's queued event under the deliver
// policy: it names the entry whose follow-up it first was. When the holder's release
// finds follow-ups left and republishes it, the copy is a wake-up: it stands for the
// mailbox's follow-ups, which are in the mailbox or were accounted for by a run since,
// not for a new one. A wake-up that meets a busy lease is therefore never appended to
// the mailbox again (the agent would be told the same thing twice), only kept as the
// issue's queued event (lease.DeliverOptions with no Followup); one that meets a free
// lease runs, and its run takes the follow-ups from the mailbox alone.
const MetaMailboxWake = "mailbox_wake"

// IsMailboxWake reports whether msg is a wake-up (MetaMailboxWake).
func IsMailboxWake(msg *message.Message) bool { return msg.Metadata.Get(MetaMailboxWake) != "" }

// deliverOptions are the deliver policy's acquire options for msg (entry): its
// follow-up record, unless it is a wake-up, and the event to queue, marked as a wake-up
// of its first entry.
func (m *Middleware) deliverOptions(msg *message.Message, entry Entry) (*lease.DeliverOptions, error) {
	cp := msg
	if !IsMailboxWake(msg) {
		cp = msg.Copy()
		cp.Metadata.Set(MetaMailboxWake, entry.ID)
	}
	fields, err := m.cfg.Source.Encode(cp)
	if err != nil {
		return nil, err
	}
	// Its entry is acked after the record (recordAndAck), never in the script: a reply
	// lost past go-redis's retries leaves it pending, for a repeat that records it.
	d := &lease.DeliverOptions{MaxDepth: m.cfg.MailboxDepth, Event: lease.QueuedEvent{Stream: entry.Stream, Fields: fields}}
	if !IsMailboxWake(msg) {
		d.Followup = FollowupOf(msg, entry)
	}
	return d, nil
}
