package inspect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	beats "github.com/ymirflow/ymirflow/internal/presence"
	"github.com/ymirflow/ymirflow/internal/redisinfo"
)

// Consumer states, from the workers' own presence beats (WorkerBeat).
const (
	// ConsumerAlive: the consumer's process renewed its presence within
	// the presence TTL; it is alive whether it is busy or waits on an empty stream.
	ConsumerAlive = "alive"
	// ConsumerDead: its process stopped renewing its presence without removing it
	// (killed, or cut off from Redis); its entries are claimed after MAX_IDLE_TIME.
	ConsumerDead = "dead"
	// ConsumerNoBeat: no presence at all: the process stopped cleanly, or it is a
	// worker that does not report one (an older version, a Python agent).
	ConsumerNoBeat = "no-heartbeat"
)

// WorkerBeat is one subscription's presence record, as its router writes it.
type WorkerBeat = beats.Beat

// Worker is one subscription's presence as its router reports it.
type Worker struct {
	WorkerBeat
	Alive bool `json:"alive"`
	// LastSeen is the time of its last beat (Redis's clock).
	LastSeen time.Time `json:"last_seen"`
}

// presence is the namespace's beats by stream, group and consumer, read with Redis's
// clock; the zero value knows of no worker.
type presence struct {
	now     time.Time
	workers map[workerRef]Worker
}

type workerRef struct{ stream, group, consumer string }

func (p presence) of(stream, group, consumer string) (Worker, bool) {
	w, ok := p.workers[workerRef{stream, group, consumer}]
	return w, ok
}

// state is a consumer's state and, for a dead one, when it was last seen.
func (p presence) state(stream, group, consumer string) (string, *Worker) {
	w, ok := p.of(stream, group, consumer)
	switch {
	case !ok:
		return ConsumerNoBeat, nil
	case w.Alive:
		return ConsumerAlive, &w
	}
	return ConsumerDead, &w
}

// queuePresence queues the reads of the presence set (and Redis's clock) on pipe; the
// returned func decodes them after Exec, so callers fold them into a round trip they
// already make.
func (in *Inspector) queuePresence(ctx context.Context, pipe redis.Pipeliner) func() (presence, error) {
	clock := pipe.Time(ctx)
	members := pipe.ZRangeWithScores(ctx, in.topo.Workers(), 0, -1)
	return func() (presence, error) {
		now, err := clock.Result()
		if err != nil {
			return presence{}, fmt.Errorf("time: %w", err)
		}
		zs, err := members.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return presence{}, fmt.Errorf("zrange %s: %w", in.topo.Workers(), err)
		}
		p := presence{now: now, workers: map[workerRef]Worker{}}
		for _, z := range zs {
			m, _ := z.Member.(string)
			b, ok := beats.Decode(m)
			if !ok {
				continue
			}
			until := time.UnixMilli(int64(z.Score))
			w := Worker{WorkerBeat: b, Alive: !until.Before(now), LastSeen: until.Add(-beats.TTL)}
			ref := workerRef{b.Stream, b.Group, b.Consumer}
			// A restarted process with the same consumer name is a second member: the
			// newest beat speaks for the consumer.
			if old, ok := p.workers[ref]; !ok || w.LastSeen.After(old.LastSeen) {
				p.workers[ref] = w
			}
		}
		return p, nil
	}
}

// Workers returns every worker subscription that reported its presence in the last
// hour, alive or not, ordered by stream, group and consumer.
//
// Cost: one round trip (TIME and ZRANGE pipelined).
func (in *Inspector) Workers(ctx context.Context) ([]Worker, error) {
	pipe := in.rdb.Pipeline()
	read := in.queuePresence(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("presence: %w", err)
	}
	p, err := read()
	if err != nil {
		return nil, err
	}
	out := make([]Worker, 0, len(p.workers))
	for _, w := range p.workers {
		out = append(out, w)
	}
	sortWorkers(out)
	return out, nil
}

func sortWorkers(ws []Worker) {
	slices.SortFunc(ws, func(a, b Worker) int {
		return cmp.Or(cmp.Compare(a.Stream, b.Stream), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Consumer, b.Consumer))
	})
}

// serverCache remembers what the server is, asked once per Inspector.
type serverCache struct {
	mu    sync.Mutex
	known bool
	s     redisinfo.Server
}

// server returns the server's name and version, asking it (one round trip) only the
// first time; an ask that failed on the network is retried on the next call.
func (in *Inspector) server(ctx context.Context) redisinfo.Server {
	in.srv.mu.Lock()
	defer in.srv.mu.Unlock()
	if !in.srv.known {
		s, err := redisinfo.ServerInfo(ctx, in.rdb)
		if err != nil {
			// Assume the usual. A refusal (an ACL without INFO) is for good: not asked
			// again; a network failure is.
			s = redisinfo.Server{Name: "redis", Version: redisinfo.MinRedisVersion}
			var re redis.Error
			if !errors.As(err, &re) {
				return s
			}
		}
		in.srv.s, in.srv.known = s, true
	}
	return in.srv.s
}
