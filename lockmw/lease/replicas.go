package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting for replicas (Options.WaitReplicas). Redis replicates asynchronously: a
// primary that fails over right after an acquire can hand the issue to a replica that
// never saw the lease, and a second holder starts. With WaitReplicas = N every acquire
// and every extend is followed by WAIT N (or WAITAOF 0 N, Options.WaitAOF), and a lease
// counts as held, or extended, only once N replicas have acknowledged it.
//
// WAIT counts the writes of the connection it is sent on: it waits until the replicas
// have the primary's replication stream up to that connection's last write. So the WAIT
// is sent in one pipeline with a write of the lease on the same connection: an extend
// (a compare-and-PEXPIRE, which writes whenever the lease is ours). The acquire is not
// that write: when go-redis sends an acquire again after a lost reply, the repeat finds
// its own token and writes nothing, and a WAIT after it on a fresh connection would
// count nothing and answer at once. The extend always writes, on every try, and
// replication is one ordered stream: replicas that have the extend have the acquire.
// On Redis Cluster the pipeline goes to the primary that owns the lease's slot (the
// lease's keys share one); a cluster client would send a keyless WAIT to any node. A
// group key, in a slot of its own, is extended and waited for on its own primary.

// ErrNotReplicated is wrapped by the error that says how many acknowledged: fewer
// replicas than Options.WaitReplicas acknowledged an acquire or an extend within
// Options.WaitTimeout.
var ErrNotReplicated = errors.New("lease: not acknowledged by enough replicas")

// notReplicatedError says how many replicas acknowledged a lease's write in time;
// callers test for ErrNotReplicated.
type notReplicatedError struct {
	Lock      string        // the lease's lock key
	Want, Got int64         // replicas asked for, replicas that acknowledged
	Timeout   time.Duration // how long the WAIT waited
	AOF       bool          // WAITAOF: acknowledged means written to the replica's AOF
}

func (e *notReplicatedError) Error() string {
	what := "WAIT"
	if e.AOF {
		what = "WAITAOF"
	}
	return fmt.Sprintf("%v: %s: %s acknowledged by %d of %d replicas within %s", ErrNotReplicated, e.Lock, what, e.Got, e.Want, e.Timeout)
}

func (e *notReplicatedError) Unwrap() error { return ErrNotReplicated }

// defaultWaitTimeout is Options.WaitTimeout's default for ttl: min(1s, TTL/10). It stays
// well inside the heartbeat (TTL/3) and under go-redis's read timeout (3s by default).
func defaultWaitTimeout(ttl time.Duration) time.Duration { return min(time.Second, ttl/10) }

// ErrNoWaitAOF is returned by CheckReplicas when Options.WaitAOF is set and the server
// has no WAITAOF command (Redis before 7.2).
var ErrNoWaitAOF = errors.New("lease: the server has no WAITAOF (Redis 7.2 or later)")

// CheckReplicas makes sure the server can do what Options.WaitReplicas and WaitAOF ask
// (WAITAOF exists) and returns how many replicas the primary of the key lock has
// connected now. It is for start-up: a worker that waits for more replicas than are
// connected gets no lease at all. With WaitReplicas 0 it does nothing.
func (l *Locker) CheckReplicas(ctx context.Context, lock string) (connected int64, err error) {
	if l.opts.WaitReplicas == 0 {
		return 0, nil
	}
	rdb, err := l.waitClient(ctx, lock)
	if err != nil {
		return 0, err
	}
	if l.opts.WaitAOF {
		// COMMAND INFO answers a nil entry for a command the server does not know.
		info, err := rdb.Do(ctx, "command", "info", "waitaof").Slice()
		if err != nil {
			return 0, fmt.Errorf("lease: COMMAND INFO WAITAOF: %w", err)
		}
		if len(info) == 0 || info[0] == nil {
			return 0, ErrNoWaitAOF
		}
	}
	info, err := rdb.Do(ctx, "info", "replication").Text()
	if err != nil {
		return 0, fmt.Errorf("lease: INFO replication: %w", err)
	}
	// One line per replica: slave0:ip=...,port=...,state=online,offset=...,lag=...
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
			connected++
		}
	}
	return connected, nil
}

// waitClient is the client whose pipelines reach the primary holding lock: the Locker's
// own, or on Redis Cluster the client of the node that owns the lock's slot.
func (l *Locker) waitClient(ctx context.Context, lock string) (waitPiper, error) {
	if c, ok := l.rdb.(interface {
		MasterForKey(ctx context.Context, key string) (*redis.Client, error)
	}); ok {
		node, err := c.MasterForKey(ctx, lock)
		if err != nil {
			return nil, fmt.Errorf("lease: the primary of %s: %w", lock, err)
		}
		return node, nil
	}
	if c, ok := l.rdb.(waitPiper); ok {
		return c, nil
	}
	return nil, fmt.Errorf("lease: Options.WaitReplicas needs a go-redis client (*redis.Client or *redis.ClusterClient), got %T", l.rdb)
}

// waitPiper is what waiting needs of a client: pipelines on one connection, and the
// start-up checks.
type waitPiper interface {
	Pipeline() redis.Pipeliner
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// queueWait queues the WAIT (or WAITAOF) of Options.WaitReplicas on pipe and returns a
// function that reads its answer: nil, or a *notReplicatedError.
func (le *Lease) queueWait(ctx context.Context, pipe redis.Pipeliner) func() error {
	o := le.l.opts
	e := &notReplicatedError{Lock: le.keys.Lock, Want: int64(o.WaitReplicas), Timeout: o.WaitTimeout, AOF: o.WaitAOF}
	if o.WaitAOF {
		cmd := redis.NewIntSliceCmd(ctx, "waitaof", 0, o.WaitReplicas, o.WaitTimeout.Milliseconds())
		_ = pipe.Process(ctx, cmd)
		return func() error {
			v, err := cmd.Result()
			if err != nil {
				return fmt.Errorf("lease: WAITAOF after a write of %s: %w", le.keys.Lock, err)
			}
			if len(v) == 2 {
				e.Got = v[1]
			}
			if e.Got < e.Want {
				return e
			}
			return nil
		}
	}
	cmd := redis.NewIntCmd(ctx, "wait", o.WaitReplicas, o.WaitTimeout.Milliseconds())
	_ = pipe.Process(ctx, cmd)
	return func() error {
		n, err := cmd.Result()
		if err != nil {
			return fmt.Errorf("lease: WAIT after a write of %s: %w", le.keys.Lock, err)
		}
		if e.Got = n; n < e.Want {
			return e
		}
		return nil
	}
}

// extendReplicated is the extend of a Locker with WaitReplicas: extend.lua, the
// heartbeat's own commands and the WAIT in one pipeline on one connection of the
// lease's primary. On Redis Cluster the heartbeat's commands (an XCLAIM of a stream in
// another slot) go in a second pipeline through the cluster client. ok is false when
// the lease is not ours; err wraps ErrNotReplicated when too few replicas acknowledged.
func (le *Lease) extendReplicated(ctx context.Context) (bool, error) {
	keys, nslots := le.extendKeys()
	return le.extendReplicatedKeys(ctx, keys, true, nslots)
}

// extendReplicatedKeys is extendReplicated of keys (lock, info pairs of one hash slot,
// whose primary gets the WAIT), with the heartbeat's own commands when beat is set.
func (le *Lease) extendReplicatedKeys(ctx context.Context, keys []string, beat bool, nslots int) (bool, error) {
	rdb, err := le.l.waitClient(ctx, keys[0])
	if err != nil {
		return false, err
	}
	cluster := le.l.opts.Format == KeysCluster
	onBeat := le.onBeat
	if !beat {
		onBeat = nil
	}
	args := []any{le.token, le.l.opts.TTL.Milliseconds(), nslots}
	run := func(sha bool) (*redis.Cmd, func() error, error) {
		pipe := rdb.Pipeline()
		var ext *redis.Cmd
		if sha {
			ext = extendScript.EvalSha(ctx, pipe, keys, args...)
		} else {
			ext = extendScript.Eval(ctx, pipe, keys, args...)
		}
		if onBeat != nil && !cluster {
			onBeat(ctx, pipe)
		}
		wait := le.queueWait(ctx, pipe)
		_, err := pipe.Exec(ctx)
		if ext.Err() != nil {
			return ext, wait, ext.Err()
		}
		if err != nil && !isRedisErr(err) {
			return ext, wait, err
		}
		return ext, wait, nil
	}
	ext, wait, err := run(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		ext, wait, err = run(false)
	}
	if err != nil {
		return false, err
	}
	if n, _ := ext.Int64(); n != 1 {
		return false, nil
	}
	if onBeat != nil && cluster {
		pipe := le.l.rdb.Pipeline()
		onBeat(ctx, pipe)
		_, _ = pipe.Exec(ctx) // as on the path without waiting: the lease is what counts
	}
	return true, wait()
}

// isRedisErr reports whether err is an error reply of the server (a command refused),
// not a failure of the connection.
func isRedisErr(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// replicated is called once a lease is taken, before anyone is told: it waits for
// Options.WaitReplicas replicas to acknowledge it, and otherwise gives it back (no run
// happened under it) and returns why, wrapping ErrNotReplicated (or ErrLeaseLost, when
// the lease was already gone).
func (le *Lease) replicated(ctx context.Context) error {
	if le.l.opts.WaitReplicas == 0 {
		return nil
	}
	ok, err := le.extendReplicated(ctx)
	if ok && err == nil && le.apart {
		ok, err = le.extendApart(ctx)
	}
	if err == nil && !ok {
		err = fmt.Errorf("%w: %s was not ours when its acquire was confirmed", ErrLeaseLost, le.keys.Lock)
	}
	le.l.lagging.Store(errors.Is(err, ErrNotReplicated))
	if err != nil {
		le.giveBack(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// Replicas that lag. Once an acquire was refused because too few replicas acknowledged
// it (Locker.lagging), every acquire first proves that they acknowledge again, without
// taking the lease: a write that changes nothing (INCRBY of the lease's fence counter
// by 0, in the lease's hash slot) and the WAIT on its connection. While they do not,
// the acquire is refused as before (a *notReplicatedError) but no lock key exists for
// the WAIT's duration: an event of the issue meeting the unconfirmed key would be
// handled as busy (dropped, under the drop policy) for a lease that is then given back,
// and each refused try would take a fence. The first acquire whose probe is
// acknowledged takes the lease as usual (confirmed by its own WAIT) and ends the state.

// probeReplicas is the acquire's check while the replicas lag: nil once Options.
// WaitReplicas replicas acknowledge a write on the primary of keys.Lock, else why not
// (a *notReplicatedError naming the lock key).
func (l *Locker) probeReplicas(ctx context.Context, keys Keys) error {
	rdb, err := l.waitClient(ctx, keys.Lock)
	if err != nil {
		return err
	}
	le := &Lease{l: l, keys: keys}
	pipe := rdb.Pipeline()
	pipe.IncrBy(ctx, keys.Fence, 0)
	wait := le.queueWait(ctx, pipe)
	if _, err := pipe.Exec(ctx); err != nil && !isRedisErr(err) {
		return fmt.Errorf("lease: probe the replicas of %s: %w", keys.Lock, err)
	}
	if err := wait(); err != nil {
		return err
	}
	l.lagging.Store(false)
	return nil
}
