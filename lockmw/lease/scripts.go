package lease

import (
	"context"
	_ "embed"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/ymirflow/ymirflow/internal/xonce"
)

// The lease's Lua scripts, one file each under scripts/ (their comments give KEYS,
// ARGV and replies). Each touches only the keys of one hash slot under KeysCluster (a
// lease's own keys, with its issue key if it holds one; a group key's, alone) and runs
// atomically, so compare-and-act has no window.
var (
	// leaseSteps are the lease's steps, put before the scripts that use them (after
	// xonce's issue-index step: publish_queued files a follow-up in its issue's index
	// with it): newScript(xonce.IndexLua, leaseSteps, ...). Joined on first use, not here.
	//
	//go:embed scripts/lease.lua
	leaseSteps string
	//go:embed scripts/handoff.lua
	handoffLua string
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/acquire_scoped.lua
	acquireScopedLua string
	//go:embed scripts/acquire_or_queue.lua
	acquireOrQueueLua string
	//go:embed scripts/acquire_or_deliver.lua
	acquireOrDeliverLua string
	//go:embed scripts/mailbox_done.lua
	mailboxDoneLua string
	//go:embed scripts/extend.lua
	extendLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/force_release.lua
	forceReleaseLua string
	//go:embed scripts/acquire_or_supersede.lua
	acquireOrSupersedeLua string
	//go:embed scripts/stop_wait.lua
	stopWaitLua string
	//go:embed scripts/acquire_shared.lua
	acquireSharedLua string
	//go:embed scripts/unlock_shared.lua
	unlockSharedLua string

	acquireScript          = newScript(xonce.IndexLua, leaseSteps, acquireLua)
	acquireScopedScript    = newScript(xonce.IndexLua, leaseSteps, acquireScopedLua)
	handoffScript          = newScript(xonce.IndexLua, leaseSteps, handoffLua)
	acquireOrQueueScript   = newScript(xonce.IndexLua, leaseSteps, acquireOrQueueLua)
	acquireOrDeliverScript = newScript(xonce.IndexLua, leaseSteps, acquireOrDeliverLua)
	mailboxDoneScript      = newScript(mailboxDoneLua)
	extendScript           = newScript(extendLua)
	releaseScript          = newScript(xonce.IndexLua, leaseSteps, releaseLua)
	forceReleaseScript     = newScript(forceReleaseLua)
	acquireOrSupersede     = newScript(xonce.IndexLua, leaseSteps, acquireOrSupersedeLua)
	stopWaitScript         = newScript(xonce.IndexLua, leaseSteps, stopWaitLua)
	acquireSharedScript    = newScript(xonce.IndexLua, leaseSteps, acquireSharedLua)
	unlockSharedScript     = newScript(xonce.IndexLua, leaseSteps, unlockSharedLua)
)

// script is a Lua script put together (its parts joined) and hashed on first use, not
// at package initialisation: the sources are ≈ 1 MB in all, and a command that runs
// none (the CLI's version, history) should not pay for them at start. The second
// argument of its EVALSHA (the digest) and of its EVAL (the source) are boxed once,
// for runScript.
type script = *lazyScript

type lazyScript struct {
	once     sync.Once
	parts    []string
	s        *redis.Script
	sha, src any
}

func newScript(parts ...string) script { return &lazyScript{parts: parts} }

func (l *lazyScript) load() *lazyScript {
	l.once.Do(func() {
		src := strings.Join(l.parts, "")
		l.s = redis.NewScript(src)
		l.sha, l.src, l.parts = l.s.Hash(), src, nil
	})
	return l
}

// Script is the go-redis script.
func (l *lazyScript) Script() *redis.Script { return l.load().s }

// Run is Script.Run: EVALSHA, and EVAL if the server lost the script.
func (l *lazyScript) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return l.load().s.Run(ctx, c, keys, args...)
}

// EvalSha is Script.EvalSha.
func (l *lazyScript) EvalSha(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return l.load().s.EvalSha(ctx, c, keys, args...)
}

// Eval is Script.Eval.
func (l *lazyScript) Eval(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return l.load().s.Eval(ctx, c, keys, args...)
}

// runScript is Script.Run (EVALSHA, and EVAL if the server lost the script) for
// arguments the caller has laid out: args[3:] holds nkeys KEYS then ARGV, and args[:3]
// is filled in here. Script.Run copies its keys and arguments into a new slice and
// boxes each (an allocation apiece) on every call; the lease's hot path (acquire,
// handoff, release) builds one slice and passes its strings by pointer.
func runScript(ctx context.Context, rdb Client, s script, nkeys int, args []any) *redis.Cmd {
	s.load()
	args[0], args[1], args[2] = "evalsha", s.sha, nkeys
	cmd := scriptCmd(ctx, nkeys, args)
	_ = rdb.Process(ctx, cmd)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		args[0], args[1] = "eval", s.src
		cmd = scriptCmd(ctx, nkeys, args)
		_ = rdb.Process(ctx, cmd)
	}
	return cmd
}

func scriptCmd(ctx context.Context, nkeys int, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3) // as go-redis's eval does: a cluster client routes by it
	}
	return cmd
}

// scriptArgs returns an args slice for runScript with room for n keys and arguments.
func scriptArgs(n int) []any { return make([]any, 3, 3+n) }
