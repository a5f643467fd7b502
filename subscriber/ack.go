package subscriber

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// acker queues the XACKs of acked messages and sends them several at once: with the
// next read (reader.read), or after its delay, whichever comes first. An XACK that
// fails is queued again (XACK is idempotent).
type acker struct {
	rdb   redis.UniversalClient
	group string
	delay time.Duration
	log   zerolog.Logger

	sending sync.Mutex // held while acks taken from pending are on their way: flush waits for them

	mu      sync.Mutex
	pending []entryRef
	timer   *time.Timer
	stopped bool
}

func newAcker(rdb redis.UniversalClient, group string, delay time.Duration, log zerolog.Logger) *acker {
	return &acker{rdb: rdb, group: group, delay: delay, log: log}
}

// add queues the XACK of one entry and arms the flush timer.
func (a *acker) add(stream, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = append(a.pending, entryRef{stream, id})
	if a.stopped {
		return
	}
	if a.timer == nil {
		a.timer = time.AfterFunc(a.delay, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			a.flush(ctx)
		})
		return
	}
	if len(a.pending) == 1 {
		a.timer.Reset(a.delay)
	}
}

// take removes and returns the queued acks.
func (a *acker) take() []entryRef {
	a.mu.Lock()
	defer a.mu.Unlock()
	refs := a.pending
	a.pending = nil
	return refs
}

// queue adds the XACKs of refs to pipe, one per stream.
func (a *acker) queue(ctx context.Context, pipe redis.Pipeliner, refs []entryRef) []*redis.IntCmd {
	byStream := map[string][]string{}
	var order []string
	for _, r := range refs {
		if _, ok := byStream[r.stream]; !ok {
			order = append(order, r.stream)
		}
		byStream[r.stream] = append(byStream[r.stream], r.id)
	}
	cmds := make([]*redis.IntCmd, 0, len(order))
	for _, st := range order {
		cmds = append(cmds, pipe.XAck(ctx, st, a.group, byStream[st]...))
	}
	return cmds
}

// settle queues refs again if any of their XACKs failed.
func (a *acker) settle(refs []entryRef, cmds []*redis.IntCmd) {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			a.log.Warn().Err(err).Int("entries", len(refs)).Msg("XACK failed; sending it again")
			a.mu.Lock()
			a.pending = append(refs, a.pending...)
			a.mu.Unlock()
			return
		}
	}
}

// flush sends the queued acks now, in one round trip, once the acks on their way with
// a read have arrived.
func (a *acker) flush(ctx context.Context) {
	a.sending.Lock()
	defer a.sending.Unlock()
	refs := a.take()
	if len(refs) == 0 {
		return
	}
	pipe := a.rdb.Pipeline()
	cmds := a.queue(ctx, pipe, refs)
	_, _ = pipe.Exec(ctx) // each command's error is in cmds
	a.settle(refs, cmds)
}

// stop sends the queued acks a last time and stops the timer.
func (a *acker) stop(ctx context.Context) error {
	a.mu.Lock()
	a.stopped = true
	if a.timer != nil {
		a.timer.Stop()
	}
	a.mu.Unlock()
	a.flush(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) > 0 {
		return errors.New("subscriber: acks not sent at close; their entries stay pending")
	}
	return nil
}
