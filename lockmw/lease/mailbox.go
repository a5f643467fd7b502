package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The mailbox (deliver policy): events for an issue that arrive while its lease is
// held are appended to the lease's mailbox, a stream in the lease's hash slot
// (Keys.Mailbox), by Acquire with AcquireOptions.Deliver. The holder reads them while
// it runs (Mailbox, WaitMailbox), removes the ones its run accounted for
// (MailboxDone), and its release publishes the queued event, which starts the issue's
// next run, only if follow-ups remain. The mailbox is bounded (DeliverOptions.MaxDepth)
// and expires with the queued event (MaxHold + TTL after the last append).

// Followup is one mailbox entry: its stream id and fields.
type Followup struct {
	ID     string
	Fields map[string]string
}

// Mailbox returns up to count follow-ups of the lease's mailbox after id after ("" for
// the first), oldest first. count <= 0 reads DefaultMailboxDepth.
func (le *Lease) Mailbox(ctx context.Context, after string, count int64) ([]Followup, error) {
	if count <= 0 {
		count = DefaultMailboxDepth
	}
	start := "-"
	if after != "" {
		start = "(" + after
	}
	// Client has no XRANGE of its own (the lease needs few commands): a one-command pipeline.
	pipe := le.l.rdb.Pipeline()
	cmd := pipe.XRangeN(ctx, le.keys.Mailbox, start, "+", count)
	_, _ = pipe.Exec(ctx)
	msgs, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("lease: read mailbox %s: %w", le.keys.Mailbox, err)
	}
	return followups(msgs), nil
}

// WaitMailbox is Mailbox that waits up to block for a follow-up after after ("" waits
// for new ones only: "$"). It returns none when block passes. It holds a connection of
// the client's pool while it waits.
func (le *Lease) WaitMailbox(ctx context.Context, after string, block time.Duration) ([]Followup, error) {
	if after == "" {
		after = "$"
	}
	pipe := le.l.rdb.Pipeline()
	cmd := pipe.XRead(ctx, &redis.XReadArgs{Streams: []string{le.keys.Mailbox, after}, Block: block,
		Count: DefaultMailboxDepth})
	_, _ = pipe.Exec(ctx)
	res, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease: wait on mailbox %s: %w", le.keys.Mailbox, err)
	}
	var out []Followup
	for _, s := range res {
		out = append(out, followups(s.Messages)...)
	}
	return out, nil
}

// MailboxDone removes the follow-ups ids, which the lease's run accounted for, from
// its mailbox, if the lease is still held (else ErrLeaseLost: they stay for the next
// run). Safe to repeat.
func (le *Lease) MailboxDone(ctx context.Context, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	args := append(make([]any, 0, 1+len(ids)), le.token)
	for _, id := range ids {
		args = append(args, id)
	}
	n, err := mailboxDoneScript.Run(ctx, le.l.rdb, []string{le.keys.Lock, le.keys.Mailbox}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("lease: mailbox done %s: %w", le.keys.Mailbox, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: %s", ErrLeaseLost, le.keys.Lock)
	}
	return n, nil
}

// mailboxDepth returns how many follow-ups wait in the mailbox of (agent, rawKey).
func (l *Locker) mailboxDepth(ctx context.Context, agent, rawKey string) (int64, error) {
	issue, err := l.Canonicalize(rawKey)
	if err != nil {
		return 0, err
	}
	key := l.Keys(agent, issue).Mailbox
	pipe := l.rdb.Pipeline()
	cmd := pipe.XLen(ctx, key)
	_, _ = pipe.Exec(ctx)
	n, err := cmd.Result()
	if err != nil {
		return 0, fmt.Errorf("lease: mailbox depth %s: %w", key, err)
	}
	return n, nil
}

func followups(msgs []redis.XMessage) []Followup {
	out := make([]Followup, 0, len(msgs))
	for _, m := range msgs {
		f := Followup{ID: m.ID, Fields: make(map[string]string, len(m.Values))}
		for k, v := range m.Values {
			f.Fields[k] = fmt.Sprint(v)
		}
		out = append(out, f)
	}
	return out
}
