package lockmw

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The lease's Lua scripts, one file each under scripts/ (their comments give KEYS,
// ARGV and replies). Each touches only the keys of one lease (one hash slot under
// KeysCluster), except fenced_xadd's stream, and runs atomically, so compare-and-act
// has no window.
var (
	//go:embed scripts/lease.lua
	leaseLua string // the steps, put before the scripts that use them
	//go:embed scripts/handoff.lua
	handoffLua string
	//go:embed scripts/acquire.lua
	acquireLua string
	//go:embed scripts/acquire_or_queue.lua
	acquireOrQueueLua string
	//go:embed scripts/extend.lua
	extendLua string
	//go:embed scripts/release.lua
	releaseLua string
	//go:embed scripts/release_drain.lua
	releaseDrainLua string
	//go:embed scripts/force_release.lua
	forceReleaseLua string
	//go:embed scripts/fenced_xadd.lua
	fencedXAddLua string

	acquireScript        = redis.NewScript(leaseLua + acquireLua)
	handoffScript        = redis.NewScript(leaseLua + handoffLua)
	acquireOrQueueScript = redis.NewScript(acquireOrQueueLua)
	extendScript         = redis.NewScript(extendLua)
	releaseScript        = redis.NewScript(leaseLua + releaseLua)
	releaseDrainScript   = redis.NewScript(releaseDrainLua)
	forceReleaseScript   = redis.NewScript(forceReleaseLua)
	fencedXAddScript     = redis.NewScript(fencedXAddLua)
)
